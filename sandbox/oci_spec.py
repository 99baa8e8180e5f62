"""One OCI runtime spec generator for every sandbox runtime (runc, containerd shims, gVisor).

A :class:`SandboxSpec` says what one sandbox is: the program, its root filesystem, the one
partition it may see, the socket directory it talks through, and its limits.
:func:`oci_config` turns it into ``config.json``. The isolation switches exist so that tests can
build a control run that lacks exactly one protection and show the protection is what made the
difference; production code never turns them off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero.sandbox.seccomp import seccomp_profile

__all__ = ["FULL_ISOLATION", "Isolation", "Mount", "SandboxSpec", "oci_config", "write_bundle"]

DATA_DIR = "/data"
SOCKET_DIR = "/run/hetero"
CPU_PERIOD_US = 100_000
MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
)
READONLY_PATHS = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)


@dataclass(frozen=True, slots=True)
class Mount:
    """A host directory bind-mounted into the sandbox."""

    source: Path
    destination: str
    writable: bool = False


@dataclass(frozen=True, slots=True)
class Isolation:
    """Which protections the spec carries; all on by default (tests flip one for a control)."""

    network: bool = True
    readonly_root: bool = True
    seccomp: bool = True
    user_namespace: bool = True
    limits: bool = True


FULL_ISOLATION = Isolation()


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """One sandbox.

    Attributes:
        sandbox_id: Unique name (container id and cgroup leaf).
        rootfs: Host directory used as the root filesystem (mounted read-only).
        args: The program and its arguments.
        partition_dir: The partition's host directory, mounted at ``/data``; the only data seen.
        socket_dir: Host directory mounted at ``/run/hetero`` for the worker's Unix socket.
        mounts: Further read-only binds (the Python runtime, model files).
        env: Environment of the program.
        memory_bytes: Memory limit (swap included).
        pids: Most processes and threads at once.
        cpus: CPU quota in cores.
        tmpfs_bytes: Size of the writable ``/tmp``.
        host_uid: First host uid of the user namespace mapping (container root maps to it).
        annotations: OCI annotations (Kata reads its per-sandbox sizing from these).
    """

    sandbox_id: str
    rootfs: Path
    args: tuple[str, ...]
    partition_dir: Path | None = None
    partition_writable: bool = False
    socket_dir: Path | None = None
    mounts: tuple[Mount, ...] = ()
    env: tuple[str, ...] = ("PATH=/usr/local/bin:/usr/bin:/bin",)
    cwd: str = "/"
    memory_bytes: int = 256 * 2**20
    pids: int = 64
    cpus: float = 1.0
    tmpfs_bytes: int = 16 * 2**20
    host_uid: int = 100_000
    annotations: dict[str, str] = field(default_factory=dict)


def _bind(source: Path, destination: str, writable: bool) -> dict[str, Any]:
    options = ["rbind", "nosuid", "nodev", "rw" if writable else "ro"]
    return {"destination": destination, "type": "bind", "source": str(source), "options": options}


def oci_config(spec: SandboxSpec, isolation: Isolation = FULL_ISOLATION) -> dict[str, Any]:
    """The OCI runtime spec (``config.json`` contents) for ``spec``."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "noexec", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", f"size={spec.tmpfs_bytes}"],
        },
    ]
    if spec.partition_dir is not None:
        mounts.append(_bind(spec.partition_dir, DATA_DIR, spec.partition_writable))
    if spec.socket_dir is not None:
        mounts.append(_bind(spec.socket_dir, SOCKET_DIR, writable=True))
    mounts.extend(_bind(m.source, m.destination, m.writable) for m in spec.mounts)
    namespaces = [{"type": kind} for kind in ("pid", "ipc", "uts", "mount", "cgroup")]
    if isolation.network:
        namespaces.append({"type": "network"})
    linux: dict[str, Any] = {
        "namespaces": namespaces,
        "cgroupsPath": f"hetero-sandbox/{spec.sandbox_id}",
        "maskedPaths": list(MASKED_PATHS),
        "readonlyPaths": list(READONLY_PATHS),
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
    }
    if isolation.user_namespace:
        namespaces.append({"type": "user"})
        mapping = [{"containerID": 0, "hostID": spec.host_uid, "size": 65536}]
        linux["uidMappings"] = mapping
        linux["gidMappings"] = mapping
    if isolation.limits:
        linux["resources"].update(
            {
                "memory": {"limit": spec.memory_bytes, "swap": spec.memory_bytes},
                "pids": {"limit": spec.pids},
                "cpu": {"quota": int(spec.cpus * CPU_PERIOD_US), "period": CPU_PERIOD_US},
            }
        )
    if isolation.seccomp:
        linux["seccomp"] = seccomp_profile()
    no_caps: list[str] = []
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(spec.args),
            "env": list(spec.env),
            "cwd": spec.cwd,
            "capabilities": {
                kind: no_caps
                for kind in ("bounding", "effective", "inheritable", "permitted", "ambient")
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": str(spec.rootfs.resolve()), "readonly": isolation.readonly_root},
        "hostname": "sandbox",
        "mounts": mounts,
        "annotations": dict(spec.annotations),
        "linux": linux,
    }


def write_bundle(directory: Path, config: dict[str, Any]) -> Path:
    """Write ``config.json`` into ``directory`` (created 0700); the bundle path."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory
