"""Issue 37, F5: a sandbox does not outlive the server that started it. A server killed with
SIGKILL (no handler runs) takes its sandboxes with it, on real runc; sandboxes a dead server
left behind are reaped and audited when the next one starts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetero.sandbox.audit import AuditLog, load_or_create_signing_key, verify
from hetero.sandbox.keyring import FileKeyring
from hetero.sandbox.oci_spec import SandboxSpec
from hetero.sandbox.reaping import reap_leftovers
from hetero.sandbox.rootfs import busybox_rootfs
from hetero.sandbox.runtimes import GvisorRuntime, RuncRuntime, SandboxRuntime

SERVER = """
import sys, time
from pathlib import Path
from hetero.sandbox.keyring import FileKeyring
from hetero.sandbox.runtimes import GvisorRuntime, RuncRuntime
from hetero.sandbox.sandboxed_worker import SandboxedWorker, WorkerLimits

site = Path(sys.argv[1])
runtime = {"runc": RuncRuntime, "gvisor": GvisorRuntime}[sys.argv[2]](site / sys.argv[2])
keyring = FileKeyring(site / "keyring.json")
worker = SandboxedWorker(
    runtime, "id_cards", site / "partition", keyring, site / "work",
    limits=WorkerLimits(memory_bytes=96 * 2**20, pids=64),
).start()
print(worker.sandbox_id, flush=True)
time.sleep(3600)
"""


@pytest.fixture
def site() -> Iterator[Path]:
    if shutil.which("runc") is None:
        pytest.fail("runc is not installed: `make test` installs it (tools/sysdeps.sh)")
    directory = Path(tempfile.mkdtemp(prefix="hetero-lifeline-test-"))
    directory.chmod(0o711)
    (directory / "partition").mkdir()
    FileKeyring.create(directory / "keyring.json", {"id-cards": 16})
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def listed(runtime: SandboxRuntime) -> list[str]:
    return runtime.leftovers()


def wait_until_gone(runtime: SandboxRuntime, sandbox_id: str, deadline_s: float) -> bool:
    """Poll the runtime's own list (the condition itself, not a guessed delay)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if sandbox_id not in listed(runtime):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("name", ["runc", "gvisor"])
def test_a_sandbox_dies_with_its_killed_server(site: Path, name: str) -> None:
    if shutil.which("runsc" if name == "gvisor" else "runc") is None:
        pytest.fail(f"{name} is not installed: `make test` installs it (tools/sysdeps.sh)")
    runtime = {"runc": RuncRuntime, "gvisor": GvisorRuntime}[name](site / name)
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(site), name], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        sandbox_id = server.stdout.readline().strip()
        assert sandbox_id.startswith("hetero-id_cards-") and sandbox_id in listed(runtime)
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        assert wait_until_gone(runtime, sandbox_id, deadline_s=30.0), listed(runtime)
    finally:
        server.kill()
        server.wait()
        for leftover in listed(runtime):
            runtime.stop(leftover)


def test_leftovers_of_a_dead_server_are_reaped_and_audited(site: Path) -> None:
    """A sandbox of another (dead) server's pid in the state directory, say from a server
    killed before this fix, is removed when the next server starts; one of this process is
    left alone."""
    runtime = RuncRuntime(site / "runc")
    rootfs = busybox_rootfs(site / "busybox")
    started = []
    for sandbox_id in ("hetero-id_cards-ocr-999999999-0", f"hetero-id_cards-asr-{os.getpid()}-0"):
        spec = SandboxSpec(
            sandbox_id=sandbox_id,
            rootfs=rootfs,
            args=("/bin/sleep", "3600"),
            memory_bytes=32 * 2**20,
            pids=16,
        )
        started.append(runtime.start(spec, site / f"{sandbox_id}.log"))
    try:
        deadline = time.monotonic() + 30.0
        while len(listed(runtime)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(listed(runtime)) == 2
        key = load_or_create_signing_key(site / "audit.pem")
        log = AuditLog(site / "audit.log", key, checkpoint_interval_s=None)
        reaped = reap_leftovers([runtime], log, partitions=("id", "id_cards"))
        log.close()
        assert reaped == ["hetero-id_cards-ocr-999999999-0"]
        assert listed(runtime) == [f"hetero-id_cards-asr-{os.getpid()}-0"]
        assert verify(site / "audit.log", key.public_key()).ok
        records = (site / "audit.log").read_text()
        assert '"kind": "sandbox_reaped"' in records and "999999999" in records
        assert '"partition": "id_cards"' in records
    finally:
        for leftover in listed(runtime):
            runtime.stop(leftover)
        for process in started:
            process.wait(timeout=30)
