"""The conformance plugin as a vendor meets it: inert by default, filters that work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = "tests/backends/test_conformance.py"


def pytest_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        timeout=300,
    )


def test_inert_without_the_option() -> None:
    result = pytest_run("--collect-only", "tests/backends")
    assert result.returncode == 0, result.stdout[-2000:]
    assert "test_conformance.py::" not in result.stdout
    assert "test_npu_backend.py::" in result.stdout  # the control: the folder is collected


def test_naming_the_suite_without_a_backend_says_what_is_missing() -> None:
    result = pytest_run(SUITE)
    assert result.returncode != 0
    assert "conformance tests need --hetero-backend=NAME" in result.stdout + result.stderr


def test_exclude_and_xfail_filters() -> None:
    result = pytest_run(
        "--hetero-backend=dummy",
        "--hetero-conformance-exclude=test_telemetry",
        "--hetero-conformance-xfail=test_copy_between",
        "-rxX",
        SUITE,
    )
    assert result.returncode == 0, result.stdout[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert "2 deselected" in summary  # telemetry on dummy:0 and dummy:1
    assert "1 xpassed" in summary


def test_an_unknown_backend_is_a_clear_error() -> None:
    result = pytest_run("--hetero-backend=nosuch", SUITE)
    assert result.returncode != 0
    assert "no backend named 'nosuch'" in result.stdout + result.stderr
