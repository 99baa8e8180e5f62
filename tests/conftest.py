"""Shared test set-up: the dummy out-of-tree backend lives beside the venv, not in it."""

from __future__ import annotations

import sys
from pathlib import Path

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
