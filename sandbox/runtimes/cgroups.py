"""Reading a sandbox's cgroup after it ended: was it the memory limit that killed it?

runc resolves a relative ``cgroupsPath`` under the caller's own cgroup. On cgroup v1 (this
project's CI hosts run a v1 "hybrid" layout) the memory controller counts OOM kills in
``memory.oom_control``; on v2 they are the ``oom_kill`` line of ``memory.events``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["oom_kills"]

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup(controller: str) -> str | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") or (controller == "" and controllers == ""):
            return path
    return None


def _counter(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except OSError:
        return None
    return None


def oom_kills(relative_path: str) -> int | None:
    """OOM kills recorded for the cgroup at ``relative_path`` (under our own), or None if it
    cannot be read."""
    v1 = _own_cgroup("memory")
    if v1 is not None:
        found = _counter(
            CGROUP_ROOT / "memory" / v1.lstrip("/") / relative_path / "memory.oom_control",
            "oom_kill",
        )
        if found is not None:
            return found
    v2 = _own_cgroup("")
    if v2 is not None:
        return _counter(CGROUP_ROOT / v2.lstrip("/") / relative_path / "memory.events", "oom_kill")
    return None
