"""Shared test set-up: the dummy out-of-tree backend lives beside the venv, not in it; a
directory a sandbox's uid may search."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# `make venv` installs tests/plugins/dummy_backend with `pip --target` here, so its entry points
# are discovered by tests (and only by tests).
TEST_PLUGINS = Path(sys.prefix) / "test-plugins"
if TEST_PLUGINS.is_dir() and str(TEST_PLUGINS) not in sys.path:
    sys.path.append(str(TEST_PLUGINS))

# Shared test helpers (tests/support/*.py) import by their bare names. Only that folder goes on
# sys.path: tests/ itself would make its `backends/` folder importable as a bare package.
HELPERS = Path(__file__).parent / "support"
if str(HELPERS) not in sys.path:
    sys.path.append(str(HELPERS))


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A fresh directory the partitions' uids may search (pytest's own temporary directories
    are private to their owner), resolved as the sandbox checks name paths."""
    directory = Path(tempfile.mkdtemp(prefix="hetero-reachable-")).resolve()
    directory.chmod(0o711)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)
