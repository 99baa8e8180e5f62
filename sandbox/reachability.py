"""What a sandbox's own uid must reach on the host, checked before a sandbox starts.

A sandbox runs as its partition's host uid (``100000 + 65536 * i``), which neither owns the
host's directories nor is in their groups, so only their permission bits for others count.
Measured on this host kind (runc 1.1 and gVisor, 2026-12-05):

* A directory bound into the sandbox (the Python installation, the virtual environment, the
  checkout's folders, the model cache) needs search permission for others (``o+x``) on
  itself. A bind shows the directory's own mode; its parents inside the sandbox are the root
  skeleton's (``0755``), so the host's parents do not matter. Without it the worker cannot be
  executed: runc says ``stat ...: permission denied``, gVisor ``failed to load ...:
  permission denied``.
* runc mounts the root filesystem from inside the user namespace, as the partition's uid
  (containerd runs runc, and Kata's driver is containerd's: both are taken to need the same,
  not measured apart), so every directory from ``/`` down to the root
  filesystem needs search permission for others: a state directory under a ``0700`` home
  fails with ``mount ...: permission denied``. gVisor mounts it as the host's root, and
  bwrap runs as the calling user, so neither needs it.

Which of the two a runtime needs is its ``binds_need_search`` and ``rootfs_path_needs_search``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from hetero.sandbox.oci_spec import Mount
from hetero.sandbox.runtimes.base import SandboxRuntime

__all__ = ["first_unsearchable", "reach_problems"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _searchable(path: Path) -> bool:
    return bool(_mode(path) & stat.S_IXOTH)


def first_unsearchable(path: Path) -> Path | None:
    """The first directory from ``/`` down to ``path`` (itself included) that others may not
    search, or None. A directory not created yet ends the walk (the worker checks again
    once it has made them)."""
    resolved = path.resolve()
    for directory in (*reversed(resolved.parents), resolved):
        if not directory.is_dir():
            return None
        if not _searchable(directory):
            return directory
    return None


def reach_problems(runtime: SandboxRuntime, rootfs: Path, mounts: Iterable[Mount]) -> list[str]:
    """Why the partition's uid could not start a sandbox of ``runtime`` with this root
    filesystem and these binds, each with its fix; empty when nothing is in the way."""
    problems = []
    if runtime.binds_need_search:
        for mount in mounts:
            source = mount.source
            if source.is_dir() and not _searchable(source):
                problems.append(
                    f"{source} is bound into the sandbox but its mode {_mode(source):04o} "
                    f"keeps the partition's uid out: chmod o+x {source}"
                )
    if runtime.rootfs_path_needs_search and (blocked := first_unsearchable(rootfs)) is not None:
        problems.append(
            f"{runtime.name} mounts the sandbox's root filesystem under {rootfs} as the "
            f"partition's uid, which cannot pass {blocked} (mode {_mode(blocked):04o}): set "
            f"sandbox.state_dir to a directory others may search, such as "
            f"/var/lib/hetero/sandbox, or chmod o+x {blocked}"
        )
    return problems
