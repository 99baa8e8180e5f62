"""One execution path, checked on the source: only the executors build runtime sessions, and no
benchmark harness lives inside the runtime packages."""

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


def test_no_benchmark_harness_inside_the_runtime_packages() -> None:
    runtime = ("framework/server", "framework/engine", "framework/scheduler", "cache")
    found = [
        str(path.relative_to(ROOT))
        for folder in runtime
        for path in (ROOT / folder).rglob("bench*.py")
    ]
    assert found == []
    assert list((ROOT / "framework" / "bench").glob("*.py"))  # the control: it lives here
