"""Let a venv import ``hetero.<folder>`` straight from this repository's folders.

``make venv`` runs this with the venv's interpreter after pip has installed the metadata-only
distribution (dependencies, the ``hetero`` script, entry points). It builds
``<venv>/hetero-src/hetero/<folder>``, one directory symlink per folder that setup.py maps, and
a ``.pth`` file in the venv's site-packages that puts ``<venv>/hetero-src`` on ``sys.path``.
Directory links, not file links: a new module is importable at once, with no reinstall, and
mypy, IDEs and pytest see plain files, with no import hook. It takes milliseconds and no pip.
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PTH_NAME = "hetero-src.pth"


def mapped_folders(setup_py: Path) -> tuple[str, ...]:
    """setup.py's ``FOLDERS``, the one list of folders, read without running setup.py."""
    for node in ast.parse(setup_py.read_text(), str(setup_py)).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "FOLDERS" for target in node.targets
        ):
            return tuple(str(folder) for folder in ast.literal_eval(node.value))
    raise SystemExit(f"{setup_py}: no `FOLDERS = (...)` assignment")


def build_link_tree(repo: Path, prefix: Path, site_packages: Path) -> Path:
    """(Re)build ``prefix/hetero-src`` and the ``.pth`` naming it; returns the tree's root."""
    root = prefix / "hetero-src"
    shutil.rmtree(root, ignore_errors=True)  # removes the links, never what they point to
    for folder in mapped_folders(repo / "setup.py"):
        link = root / "hetero" / folder
        link.parent.mkdir(parents=True, exist_ok=True)
        # Relative, so the links hold wherever the checkout is mounted with its .venv.
        link.symlink_to(os.path.relpath(repo / folder, link.parent), target_is_directory=True)
    (site_packages / PTH_NAME).write_text(f"{root}\n")
    return root


def main() -> int:
    if sys.prefix == sys.base_prefix:
        print("link_tree.py: run it with the venv's python, not the system's", file=sys.stderr)
        return 2
    build_link_tree(REPO, Path(sys.prefix), Path(sysconfig.get_path("purelib")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
