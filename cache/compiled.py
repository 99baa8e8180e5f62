"""Which of the feature cache's modules run compiled, and whether a build of them may be used.

The ``.py`` files are the only source and the package works from them alone. ``make venv``
(``tools/build_native.py``) compiles the modules in :data:`COMPILED` with mypyc into the venv,
in a folder named by a hash of the sources the build was made from (:func:`source_key`: those
modules and the hetero modules they import). At import, ``hetero.cache`` puts that folder first
on its search path only if the sources **as they are now** hash to a build that exists: a source
edited since the build has another key, so the old build is never imported and the ``.py`` files
run (the same decisions, slower) until the next ``make venv``. ``HETERO_COMPILED=0`` ignores
every build. A wheel install has no build and runs the ``.py`` files.

This module imports only the standard library and is never compiled itself: the build tool
loads it by its path, before anything of hetero can be imported.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import sys
import sysconfig
from pathlib import Path

__all__ = [
    "COMPILED",
    "GROUP",
    "build_folder",
    "compiled_folder",
    "running_compiled",
    "source_key",
    "sources",
]

logger = logging.getLogger(__name__)

# The hot paths: the memory tier's reads and writes (with its queues' upkeep, its frequency
# sketch and the window steering it inlines, one class hierarchy and one build), the codec's
# decode and the Bloom check of every lower-tier read. FeatureCache and DiskTier stay
# interpreted: tests and callers replace their methods on instances, which compiled (native)
# classes refuse (docs/cache.md has what compiling them measured).
COMPILED = (
    "bloom",
    "codec",
    "frequency_sketch",
    "memory_queues",
    "memory_tier",
    "window_steering",
)
# The hetero modules they import that are not compiled with them (paths from the folder that
# holds the package folders): mypyc builds against their types, so they are in the key too.
IMPORTED = ("framework/errors.py",)
# mypyc's shared library for the group, importable as hetero.cache.native__mypyc.
GROUP = "hetero.cache.native"
BUILDS = "hetero-compiled"  # under the venv's prefix
FORMAT = b"mypyc-1"  # bumped when the build's options change, so older builds are not used


def sources(package: Path) -> list[Path]:
    """The files a build is made from, ``package`` being the folder of ``hetero.cache``."""
    return [package / f"{name}.py" for name in COMPILED] + [
        package.parent / path for path in IMPORTED
    ]


def source_key(package: Path) -> str:
    """A hash of :func:`sources` as they are now (BLAKE2b-128, hex)."""
    digest = hashlib.blake2b(FORMAT, digest_size=16)
    for path in sources(package):
        content = path.read_bytes()
        digest.update(b"%d\0%s\0" % (len(content), path.name.encode()))
        digest.update(content)
    return digest.hexdigest()


def build_folder(package: Path, prefix: str = sys.prefix) -> Path:
    """Where the build of the sources as they are now lives (or would)."""
    return Path(prefix) / BUILDS / source_key(package)


def compiled_folder(package: str, *, enabled: bool = True, prefix: str = sys.prefix) -> str | None:
    """The folder of compiled modules to search before ``package`` (the source folder), or None
    when there is no complete build of the sources as they are now."""
    if not enabled:
        return None
    try:
        folder = build_folder(Path(package), prefix) / "hetero" / "cache"
    except OSError as err:  # a source that cannot be read: its build cannot be trusted
        logger.debug("hetero.cache: not using compiled modules: %s", err)
        return None
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    shared = GROUP.rsplit(".", 1)[1] + "__mypyc"
    if all((folder / f"{name}{suffix}").is_file() for name in (*COMPILED, shared)):
        return str(folder)
    logger.debug("hetero.cache: no compiled build of these sources (make venv builds one)")
    return None


def running_compiled() -> dict[str, bool]:
    """For each module of :data:`COMPILED` (imported now if it was not), whether this process
    runs it compiled (``hetero bench cache`` reports it beside its figures)."""
    return {
        name: not (importlib.import_module(f"hetero.cache.{name}").__file__ or "").endswith(".py")
        for name in COMPILED
    }
