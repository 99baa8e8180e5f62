"""One execution path, checked on the source: only the executors build runtime sessions. (That
nothing in the product but the CLI's ``hetero bench`` imports the benchmark harness is the
import contract's job: pyproject.toml's ``[tool.importlinter]``, tests/unit/test_layers.py.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("framework", "backends", "cache", "sandbox", "models")
EXECUTORS = ROOT / "framework" / "executors"
SESSION = re.compile(
    r"InferenceSession\(|\.compile_model\(|create_infer_request\(|AsyncLLM\.from_engine_args\("
)


def _sources() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def test_only_the_executors_build_runtime_sessions() -> None:
    found = [
        str(path.relative_to(ROOT))
        for path in _sources()
        if SESSION.search(path.read_text("utf-8")) and EXECUTORS not in path.parents
    ]
    assert found == []
    in_executors = [p for p in _sources() if EXECUTORS in p.parents]
    assert any(SESSION.search(p.read_text("utf-8")) for p in in_executors)  # the control
