"""Root filesystems for sandboxes, built from what the host already has (no image registry).

* :func:`busybox_rootfs`: one static busybox and its applets (Debian ``busybox-static``), about
  2 MB; probes and shell steps run here.
* :func:`python_rootfs`: an empty skeleton whose ``/usr`` and Python installation are bind-mounted
  read-only from the host (:func:`python_mounts`), so a worker runs the same interpreter and
  wheels as the orchestrator without copying a gigabyte of site-packages.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from hetero.framework.errors import HeteroError
from hetero.sandbox.oci_spec import Mount

__all__ = [
    "RootfsError",
    "busybox_rootfs",
    "ensure_mountpoints",
    "python_mounts",
    "python_rootfs",
]

_PASSWD = "root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
_GROUP = "root:x:0:\nnobody:x:65534:\n"
_SKELETON_DIRS = ("proc", "dev", "sys", "tmp", "data", "run/hetero", "etc", "usr")


class RootfsError(HeteroError, RuntimeError):
    """A root filesystem cannot be built (a host tool is missing)."""


def _skeleton(root: Path) -> None:
    for name in _SKELETON_DIRS:
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "etc" / "passwd").write_text(_PASSWD)
    (root / "etc" / "group").write_text(_GROUP)
    root.chmod(0o755)


def busybox_rootfs(root: Path) -> Path:
    """A root filesystem of static busybox applets at ``root`` (reused when already built)."""
    marker = root / ".hetero-busybox"
    if marker.exists():
        return root
    busybox = shutil.which("busybox")
    if busybox is None:
        raise RootfsError(
            "busybox is not installed: install the Debian package busybox-static "
            "(apt-get install busybox-static)"
        )
    with open(busybox, "rb") as binary:
        if b"ld-linux" in binary.read(4096):  # an ELF interpreter: dynamically linked
            raise RootfsError(
                f"{busybox} is dynamically linked; the sandbox root needs the static one "
                "(apt-get install busybox-static)"
            )
    probe = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0 or "sh" not in probe.stdout.split():
        raise RootfsError(f"{busybox} does not list its applets: {probe.stderr.strip()}")
    _skeleton(root)
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    shutil.copy2(busybox, bin_dir / "busybox")
    for applet in probe.stdout.split():
        link = bin_dir / applet
        if applet != "busybox" and not link.exists():
            link.symlink_to("busybox")
    marker.touch()
    return root


def python_rootfs(root: Path) -> Path:
    """A skeleton root for a Python worker: ``/bin``, ``/lib``, ``/lib64`` point into ``/usr``,
    which :func:`python_mounts` binds read-only from the host."""
    _skeleton(root)
    for name in ("bin", "sbin", "lib", "lib64"):
        link = root / name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(f"usr/{name}")
    return root


def python_mounts(*extra: Path) -> tuple[Mount, ...]:
    """Read-only binds that let this interpreter, its environment and ``extra`` paths run
    inside a :func:`python_rootfs` at the same paths as on the host."""
    # hetero's folders (an editable install links to them), not the folder that holds them: a
    # bind shows a directory's own mode, so a checkout cloned into a private (0700) directory
    # would keep the sandbox's uid out; each folder git made is searchable
    source_root = Path(__file__).resolve().parents[1]
    folders = (p for p in source_root.iterdir() if p.is_dir() and not p.name.startswith("."))
    paths = {Path("/usr"), Path(sys.base_prefix), Path(sys.prefix), *folders, *extra}
    for entry in sys.path:
        if ("site-packages" in entry or "__editable__" in entry) and Path(entry).is_dir():
            paths.add(Path(entry).resolve())
    kept: list[Path] = []
    for path in sorted(paths, key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(parent) for parent in kept):
            kept.append(path)
    return tuple(Mount(path, str(path)) for path in kept if path.exists())


def ensure_mountpoints(root: Path, mounts: tuple[Mount, ...]) -> None:
    """Create each mount's destination directory in ``root`` beforehand: the root is mounted
    read-only and owned by the host, so the runtime cannot create them inside the sandbox."""
    for mount in mounts:
        target = root / mount.destination.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        for parent in (target, *target.parents):
            if parent == root or not parent.is_relative_to(root):
                break
            parent.chmod(0o755)
