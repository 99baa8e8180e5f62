"""Isolation claims, each proven with real runtimes and a control run that flips it.

Every test runs the same busybox probe twice from the same OCI spec generator: once as built
(all protections) and once with exactly one protection removed. The control shows the probe
*would* succeed, so the protected run's failure is the protection's doing. runc, containerd
(runc shim) and gVisor come from Debian packages that `make test` installs.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hetero.sandbox.oci_spec import Isolation, SandboxSpec, oci_config
from hetero.sandbox.rootfs import busybox_rootfs, ensure_mountpoints, python_mounts, python_rootfs
from hetero.sandbox.runtimes import (
    ContainerdDaemon,
    ContainerdRuntime,
    GvisorRuntime,
    KataNotInstalledError,
    KataRuntime,
    RuncRuntime,
    SandboxRuntime,
)
from hetero.sandbox.seccomp import DENIED_SYSCALLS

UID_A, UID_B = 100_000, 200_000
FULL = Isolation()


def _require(binary: str) -> None:
    if shutil.which(binary) is None:
        pytest.fail(f"{binary} is not installed: `make test` installs it (tools/sysdeps.sh)")


@pytest.fixture(scope="module")
def reachable() -> Iterator[Path]:
    """A scratch directory the user namespace's root (host uid 100000) can traverse; pytest's
    own temporary directories are private to the host's root."""
    directory = Path(tempfile.mkdtemp(prefix="hetero-sandbox-test-"))
    directory.chmod(0o711)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def rootfs(reachable: Path) -> Path:
    _require("busybox")
    return busybox_rootfs(reachable / "busybox")


@pytest.fixture(scope="module")
def partitions(reachable: Path) -> Path:
    """``parts/a`` (owned by the sandbox's uid) and ``parts/b`` (owned by another range)."""
    parts = reachable / "parts"
    parts.mkdir(mode=0o755)
    for name, uid in (("a", UID_A), ("b", UID_B)):
        directory = parts / name
        directory.mkdir()
        (directory / f"{name}.txt").write_text(f"SECRET-{name.upper()}\n")
        for path in (directory, directory / f"{name}.txt"):
            os.chown(path, uid, uid)
        directory.chmod(0o700)
    return parts


@pytest.fixture(scope="module")
def runc(tmp_path_factory: pytest.TempPathFactory) -> RuncRuntime:
    _require("runc")
    return RuncRuntime(tmp_path_factory.mktemp("runc-state"))


_ids = iter(range(10**6))


def probe(rootfs: Path, script: str, **changes: object) -> SandboxSpec:
    spec = SandboxSpec(
        sandbox_id=f"probe-{os.getpid()}-{next(_ids)}",
        rootfs=rootfs,
        args=("/bin/sh", "-c", script),
        memory_bytes=32 * 2**20,
        pids=16,
    )
    return replace(spec, **changes)  # type: ignore[arg-type]


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP listener on the host's loopback; connecting succeeds through the backlog."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


REACH = "nc -w 2 127.0.0.1 {port} -e /bin/true && echo REACHED || echo BLOCKED"


def test_sandbox_cannot_reach_a_host_loopback_service(
    runc: RuncRuntime, rootfs: Path, host_listener: int
) -> None:
    script = REACH.format(port=host_listener) + "; ip -o link | wc -l"
    isolated = runc.run(probe(rootfs, script))
    control = runc.run(probe(rootfs, script), Isolation(network=False))
    assert isolated.stdout.split() == ["BLOCKED", "1"], isolated  # loopback only
    assert control.stdout.split()[0] == "REACHED", control


def test_sandbox_sees_only_its_own_partition(
    runc: RuncRuntime, rootfs: Path, partitions: Path
) -> None:
    # b is made readable to the sandbox's uid here, so only the mount decides what is seen
    os.chown(partitions / "b", UID_A, UID_A)
    os.chown(partitions / "b" / "b.txt", UID_A, UID_A)
    try:
        script = "cat /data/a.txt /data/b/b.txt /data/b.txt 2>&1; find / -name b.txt 2>/dev/null"
        own = runc.run(probe(rootfs, script, partition_dir=partitions / "a"))
        control = runc.run(probe(rootfs, script, partition_dir=partitions))
    finally:
        os.chown(partitions / "b", UID_B, UID_B)
        os.chown(partitions / "b" / "b.txt", UID_B, UID_B)
    assert "SECRET-A" in own.stdout and "SECRET-B" not in own.stdout, own
    assert "/b.txt" not in own.stdout.split("\n")[-2:], own
    assert "SECRET-B" in control.stdout, control


def test_a_wrongly_mounted_partition_is_still_unreadable_under_another_uid(
    runc: RuncRuntime, rootfs: Path, partitions: Path
) -> None:
    script = "cat /data/b.txt 2>&1"
    wrong_uid = runc.run(probe(rootfs, script, partition_dir=partitions / "b", host_uid=UID_A))
    own_uid = runc.run(probe(rootfs, script, partition_dir=partitions / "b", host_uid=UID_B))
    assert "Permission denied" in wrong_uid.stdout and "SECRET-B" not in wrong_uid.stdout
    assert "SECRET-B" in own_uid.stdout, own_uid


def test_sandbox_cannot_write_its_root(runc: RuncRuntime, reachable: Path, rootfs: Path) -> None:
    # a root the sandbox's uid owns, so that only the read-only mount stands in the way
    writable = reachable / "writable-rootfs"
    shutil.copytree(rootfs, writable, symlinks=True)
    for path in (writable, writable / "etc"):
        os.chown(path, UID_A, UID_A)
    script = "touch /etc/probe 2>&1 && echo WROTE"
    protected = runc.run(probe(writable, script))
    control = runc.run(probe(writable, script), Isolation(readonly_root=False))
    assert "Read-only file system" in protected.stdout and "WROTE" not in protected.stdout
    assert "WROTE" in control.stdout, control


GROW = "awk 'BEGIN { s = \"x\"; for (i = 0; i < 26; i++) s = s s; print length(s) }'"


def test_sandbox_is_killed_at_its_memory_limit(runc: RuncRuntime, rootfs: Path) -> None:
    limited = runc.run(probe(rootfs, GROW, memory_bytes=32 * 2**20))
    control = runc.run(probe(rootfs, GROW), Isolation(limits=False))
    assert limited.killed and limited.oom_killed, limited
    assert control.returncode == 0 and control.stdout.strip() == str(2**26), control


FORK = "for i in $(seq 40); do sleep 1 & done 2>&1; wait; echo FORKED"


def test_sandbox_cannot_fork_past_its_pids_limit(runc: RuncRuntime, rootfs: Path) -> None:
    limited = runc.run(probe(rootfs, FORK, pids=16))
    control = runc.run(probe(rootfs, FORK), Isolation(limits=False))
    assert "can't fork" in limited.stdout + limited.stderr, limited
    assert "can't fork" not in control.stdout + control.stderr and "FORKED" in control.stdout


def test_a_forbidden_syscall_fails_under_seccomp(runc: RuncRuntime, rootfs: Path) -> None:
    assert "unshare" in DENIED_SYSCALLS
    script = "grep Seccomp: /proc/self/status; unshare -U id 2>&1"
    filtered = runc.run(probe(rootfs, script))
    control = runc.run(probe(rootfs, script), Isolation(seccomp=False))
    assert "Seccomp:\t2" in filtered.stdout and "Operation not permitted" in filtered.stdout
    assert "Seccomp:\t0" in control.stdout and "uid=65534" in control.stdout, control


def test_sandbox_runs_without_capabilities_and_with_no_new_privileges(
    runc: RuncRuntime, rootfs: Path
) -> None:
    out = runc.run(probe(rootfs, "grep -E 'CapEff|NoNewPrivs' /proc/self/status; id -u"))
    assert "CapEff:\t0000000000000000" in out.stdout
    assert "NoNewPrivs:\t1" in out.stdout
    assert out.stdout.split()[-1] == "0"  # root inside, uid 100000 outside
    config = oci_config(probe(rootfs, "true"))
    assert config["linux"]["uidMappings"][0]["hostID"] == UID_A


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerdDaemon]:
    """A private containerd whose PATH also holds ``containerd-shim-kata-v2`` pointing at the
    runc shim: the Kata driver's command line then runs end to end (plumbing, not a VM)."""
    _require("containerd")
    shims = tmp_path_factory.mktemp("shims")
    (shims / "containerd-shim-kata-v2").symlink_to(shutil.which("containerd-shim-runc-v2") or "")
    directory = Path("/tmp") / f"hetero-ctrd-{os.getpid()}"  # socket paths must stay short
    with ContainerdDaemon(directory, extra_path=(shims,)) as daemon:
        yield daemon
    shutil.rmtree(directory, ignore_errors=True)


def _isolation_probe(
    runtime: SandboxRuntime, rootfs: Path, port: int, partitions: Path
) -> list[str]:
    script = (
        REACH.format(port=port)
        + "; touch /probe 2>/dev/null && echo WROTE || echo READONLY; cat /data/a.txt"
    )
    out = runtime.run(probe(rootfs, script, partition_dir=partitions / "a"))
    assert out.returncode == 0, out
    return out.stdout.split()


def test_containerd_with_the_runc_shim_runs_the_same_spec(
    containerd: ContainerdDaemon,
    tmp_path: Path,
    rootfs: Path,
    host_listener: int,
    partitions: Path,
) -> None:
    runtime = ContainerdRuntime(tmp_path / "state", containerd.address)
    assert runtime.availability().available
    assert _isolation_probe(runtime, rootfs, host_listener, partitions) == [
        "BLOCKED",
        "READONLY",
        "SECRET-A",
    ]
    memory = runtime.run(probe(rootfs, GROW, memory_bytes=32 * 2**20))
    assert memory.killed, memory


def test_kata_driver_plumbing_through_containerd(
    containerd: ContainerdDaemon, tmp_path: Path, rootfs: Path
) -> None:
    """Proves the Kata driver's command line, spec and annotations; NOT VM isolation: the shim
    name resolves to runc's shim here because this host cannot run Kata."""
    kata = KataRuntime(tmp_path / "state", containerd.address, check_host=False)
    spec = probe(rootfs, "grep Seccomp: /proc/self/status", memory_bytes=512 * 2**20, cpus=1.5)
    config = kata.config(spec)
    annotations = config["annotations"]
    assert isinstance(annotations, dict)
    assert annotations["io.katacontainers.config.hypervisor.default_memory"] == "512"
    assert annotations["io.katacontainers.config.hypervisor.default_vcpus"] == "2"
    out = kata.run(spec)
    assert out.returncode == 0 and "Seccomp:\t2" in out.stdout, out


def test_kata_absent_gives_containerds_exact_text(tmp_path: Path, rootfs: Path) -> None:
    _require("containerd")
    with ContainerdDaemon(Path("/tmp") / f"hetero-ctrd-plain-{os.getpid()}") as daemon:
        kata = KataRuntime(tmp_path / "state", daemon.address, check_host=False)
        with pytest.raises(KataNotInstalledError) as caught:
            kata.run(probe(rootfs, "true"))
    message = str(caught.value)
    assert message.startswith("Kata not installed: containerd says: ")
    assert 'binary not installed "containerd-shim-kata-v2"' in message
    assert "kata-runtime check" in message  # how to install and verify
    checked = KataRuntime(tmp_path / "state2", daemon.address)
    if shutil.which("kata-runtime") is None:
        assert not checked.availability().available


def test_gvisor_runs_the_spec_with_a_user_space_kernel(
    tmp_path: Path, rootfs: Path, host_listener: int, partitions: Path
) -> None:
    _require("runsc")
    runtime = GvisorRuntime(tmp_path / "state")
    assert _isolation_probe(runtime, rootfs, host_listener, partitions) == [
        "BLOCKED",
        "READONLY",
        "SECRET-A",
    ]
    config = runtime.config(probe(rootfs, "true"))
    linux = config["linux"]
    assert isinstance(linux, dict) and "uidMappings" not in linux


CLONE_NEWUSER_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)
if pid == 0:
    os._exit(0)
print("CLONED" if pid > 0 else f"REFUSED errno={ctypes.get_errno()}")
"""


def test_clone_into_a_new_namespace_fails_under_seccomp(runc: RuncRuntime, reachable: Path) -> None:
    root = python_rootfs(reachable / "python-root")
    mounts = python_mounts()
    ensure_mountpoints(root, mounts)
    spec = probe(root, "", args=(sys.executable, "-c", CLONE_NEWUSER_PROBE), mounts=mounts)
    filtered = runc.run(spec, timeout_s=120)
    control = runc.run(replace(spec, sandbox_id=spec.sandbox_id + "-c"), Isolation(seccomp=False))
    assert filtered.stdout.strip() == "REFUSED errno=1", filtered
    assert control.stdout.strip() == "CLONED", control


VSOCK_PROBE = """
import socket
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close()
    print("OPENED")
except OSError as err:
    print(f"REFUSED errno={err.errno}")
"""


def test_a_vsock_socket_is_refused_under_seccomp(runc: RuncRuntime, reachable: Path) -> None:
    """vsock reaches the hypervisor's side whatever the network namespace says."""
    if not Path("/dev/vsock").exists():
        pytest.skip("no /dev/vsock on this host: the control could not open one either")
    root = python_rootfs(reachable / "python-root")
    mounts = python_mounts()
    ensure_mountpoints(root, mounts)
    spec = probe(root, "", args=(sys.executable, "-c", VSOCK_PROBE), mounts=mounts)
    filtered = runc.run(spec, timeout_s=120)
    control = runc.run(replace(spec, sandbox_id=spec.sandbox_id + "-c"), Isolation(seccomp=False))
    assert filtered.stdout.strip() == "REFUSED errno=1", filtered
    assert control.stdout.strip() == "OPENED", control


class _ExecutableDevRunc(RuncRuntime):
    """The control: the same spec with ``noexec`` taken off ``/dev``."""

    def config(self, spec: SandboxSpec, isolation: Isolation = FULL) -> dict[str, object]:
        config = super().config(spec, isolation)
        mounts = config["mounts"]
        assert isinstance(mounts, list)
        for mount in mounts:
            if mount["destination"] == "/dev":
                mount["options"] = [o for o in mount["options"] if o != "noexec"]
        return config


def test_dev_is_not_executable(runc: RuncRuntime, rootfs: Path) -> None:
    # busybox picks its applet by name: a copy named echo is echo
    script = "cp /bin/busybox /dev/echo && /dev/echo EXECUTED || echo REFUSED"
    protected = runc.run(probe(rootfs, script))
    control = _ExecutableDevRunc(runc.state_dir).run(probe(rootfs, script))
    assert protected.stdout.strip().splitlines()[-1] == "REFUSED", protected
    assert control.stdout.strip() == "EXECUTED", control
