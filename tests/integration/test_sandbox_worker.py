"""The long-lived sandbox worker on real runc: decryption happens inside, plaintext never lands
on the host, a worker that dies mid-request is restarted and loses nothing."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetero.sandbox.audit import AuditLog, load_or_create_signing_key
from hetero.sandbox.keyring import FileKeyring
from hetero.sandbox.partition_store import PartitionStore
from hetero.sandbox.runtimes import GvisorRuntime, RuncRuntime, SandboxRunError
from hetero.sandbox.sandboxed_worker import (
    SandboxedWorker,
    SandboxWorkerError,
    WorkerDiedError,
    WorkerLimits,
)

CANARY = b"CANARY-7f3a9c-11010519491231002X"
LIMITS = WorkerLimits(memory_bytes=96 * 2**20, pids=64)


@pytest.fixture(scope="module")
def site() -> Iterator[Path]:
    """Partitions, keys and sandbox state outside pytest's private temporary directories (the
    user namespace's root must traverse them) and outside the Python installation."""
    if shutil.which("runc") is None:
        pytest.fail("runc is not installed: `make test` installs it (tools/sysdeps.sh)")
    directory = Path(tempfile.mkdtemp(prefix="hetero-worker-test-"))
    directory.chmod(0o711)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def keyring(site: Path) -> FileKeyring:
    return FileKeyring.create(site / "keyring.json", {"id-cards": 16})


@pytest.fixture(scope="module")
def store(site: Path, keyring: FileKeyring) -> PartitionStore:
    return PartitionStore(site / "partitions", "id_cards", keyring, "id-cards", "SM4-GCM")


@pytest.fixture(scope="module")
def worker(site: Path, store: PartitionStore, keyring: FileKeyring) -> Iterator[SandboxedWorker]:
    runtime = RuncRuntime(site / "runc")
    with SandboxedWorker(
        runtime, "id_cards", store.directory, keyring, site / "work", limits=LIMITS
    ) as started:
        yield started


def test_the_worker_decrypts_inside_the_sandbox(
    worker: SandboxedWorker, store: PartitionStore
) -> None:
    store.put("card-1", b"front side " + CANARY, subject="person-1")
    result = worker.process("card-1")
    assert result == {
        "sha256": hashlib.sha256(b"front side " + CANARY).hexdigest(),
        "bytes": len(CANARY) + 11,
    }


def test_the_canary_never_appears_in_plaintext_on_disk_in_the_audit_log_or_in_logs(
    worker: SandboxedWorker,
    store: PartitionStore,
    site: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    audit = AuditLog(site / "audit.log", load_or_create_signing_key(site / "audit.pem"))
    store.put("card-2", CANARY, subject="person-2")
    audit.append("access", principal="officer", partition="id_cards", detail={"object": "card-2"})
    worker.process("card-2")
    audit.append("key_use", partition="id_cards", detail={"object": "card-2", "op": "unwrap"})
    audit.close()
    seen = [path for path in site.rglob("*") if path.is_file() and CANARY in path.read_bytes()]
    assert seen == []
    assert CANARY.decode() not in caplog.text
    # the control: the canary is plainly there before encryption and after decryption
    assert store.get("card-2") == CANARY
    assert (site / "audit.log").exists() and (site / "work" / "worker.log").exists()


def test_a_tampered_object_is_refused_inside_and_the_worker_lives_on(
    worker: SandboxedWorker, store: PartitionStore
) -> None:
    store.put("card-3", b"genuine")
    path = store.directory / "card-3"
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1
    path.write_bytes(bytes(blob))
    with pytest.raises(SandboxWorkerError, match="card-3"):
        worker.process("card-3")
    store.put("card-4", b"fine")
    assert worker.process("card-4")["bytes"] == 4


def test_a_worker_that_dies_mid_request_is_restarted_and_nothing_is_lost(
    worker: SandboxedWorker, store: PartitionStore
) -> None:
    huge = os.urandom(48 * 2**20)  # ciphertext + plaintext + Python exceed the 96 MiB limit
    store.put("scan-huge", huge)
    restarts = worker.restarts
    with pytest.raises(WorkerDiedError, match="restarted and the object is intact") as caught:
        worker.process("scan-huge")
    assert "killed" in str(caught.value)
    assert worker.restarts == restarts + 1
    assert store.get("scan-huge") == huge  # the object is untouched on disk
    store.put("card-5", b"after the restart")
    assert worker.process("card-5")["bytes"] == len(b"after the restart")


def test_an_object_of_another_partition_is_not_found_in_this_sandbox(
    worker: SandboxedWorker, site: Path, keyring: FileKeyring
) -> None:
    other = PartitionStore(site / "partitions", "voice", keyring, "id-cards", "SM4-GCM")
    other.put("rec-1", b"someone else's recording")
    with pytest.raises(FileNotFoundError):
        worker.process("rec-1")  # the host side looks only in its own partition


def test_the_same_worker_runs_under_gvisor(site: Path, keyring: FileKeyring) -> None:
    if shutil.which("runsc") is None:
        pytest.fail("runsc is not installed: `make test` installs it (tools/sysdeps.sh)")
    store = PartitionStore(site / "partitions", "gvisor_part", keyring, "id-cards", "SM4-GCM")
    store.put("scan", CANARY)
    runtime = GvisorRuntime(site / "gvisor")
    with SandboxedWorker(
        runtime, "gvisor_part", store.directory, keyring, site / "work-gvisor", host_uid=300_000
    ) as worker:
        assert worker.process("scan") == {
            "sha256": hashlib.sha256(CANARY).hexdigest(),
            "bytes": len(CANARY),
        }


def test_a_worker_the_partitions_uid_cannot_reach_says_why_before_anything_starts(
    site: Path, store: PartitionStore, keyring: FileKeyring
) -> None:
    private = site.resolve() / "home"  # the check names resolved paths
    private.mkdir(mode=0o700)  # a root's home on Debian
    runc = RuncRuntime(site / "runc-reach")
    blocked = SandboxedWorker(runc, "id_cards", store.directory, keyring, private / "work")
    with pytest.raises(SandboxRunError, match=rf"cannot pass {private} \(mode 0700\)"):
        blocked.start()
    # the check is right: runc, started anyway, cannot mount that root filesystem
    process = runc.start(blocked.spec(), site / "runc-reach.log")
    try:
        assert process.wait(timeout=60) != 0
    finally:
        runc.stop(blocked.spec().sandbox_id)
    assert "permission denied" in (site / "runc-reach.log").read_text()
    # and no stricter than the runtime: gVisor mounts the root as the host's root
    gvisor = GvisorRuntime(site / "gvisor-reach")
    with SandboxedWorker(
        gvisor, "id_cards", store.directory, keyring, private / "work-gvisor"
    ) as started:
        store.put("card-reach", b"reached")
        assert started.process("card-reach")["bytes"] == len(b"reached")


def test_a_bound_directory_the_partitions_uid_cannot_enter_is_named(
    site: Path, store: PartitionStore, keyring: FileKeyring
) -> None:
    models = site / "models"
    models.mkdir(mode=0o700)
    runtime = RuncRuntime(site / "runc-bound")
    worker = SandboxedWorker(
        runtime, "id_cards", store.directory, keyring, site / "work-bound", extra_mounts=(models,)
    )
    with pytest.raises(SandboxRunError, match=rf"{models} is bound .* chmod o\+x {models}$"):
        worker.start()
    models.chmod(0o711)  # the control
    with worker:
        store.put("card-bound", b"bound")
        assert worker.process("card-bound")["bytes"] == len(b"bound")
