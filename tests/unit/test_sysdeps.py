"""tools/sysdeps.sh, the one place naming the Debian packages `make run` and `make test` need:
silent when every program is on PATH, else one line naming the packages and the command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "sysdeps.sh"
TEST_PROGRAMS = (
    "redis-server",
    "softhsm2-util",
    "runc",
    "containerd",
    "busybox",
    "newuidmap",
    "runsc",
    "bwrap",
    "espeak-ng",
    "prometheus",
    "systemd-analyze",
    "gcc",
)


def fake_program(path: Path, exit_code: int = 0) -> Path:
    path.write_text(f"#!/bin/sh\nexit {exit_code}\n")
    path.chmod(0o755)
    return path


def sysdeps(
    target: str, path: Path, *programs: str, python_has_ensurepip: bool = True
) -> subprocess.CompletedProcess[str]:
    """The script with only ``programs`` (fakes) and ``id`` on PATH, never installing; the venv
    is ``path``'s sibling ``venv`` (absent unless a test makes it), and the Python that would
    create it has ensurepip (``import ensurepip`` succeeds) or not."""
    path.mkdir(exist_ok=True)
    (path / "id").symlink_to(shutil.which("id") or "/usr/bin/id")
    for name in programs:
        fake_program(path / name)
    python = fake_program(path.parent / "python", 0 if python_has_ensurepip else 1)
    return subprocess.run(
        ["/bin/sh", str(SCRIPT), target],
        env={
            "PATH": str(path),
            "HETERO_SYSDEPS_INSTALL": "0",
            "PYTHON": str(python),
            "VENV": str(path.parent / "venv"),
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_missing_programs_stop_make_with_one_line_naming_packages_and_command(
    tmp_path: Path,
) -> None:
    result = sysdeps("test", tmp_path / "bin", "redis-server", "runc")
    assert result.returncode == 1 and result.stdout == ""
    packages = (
        "softhsm2 containerd busybox-static uidmap runsc bubblewrap espeak-ng prometheus"
        " systemd gcc"
    )
    assert result.stderr.count("\n") == 1
    assert f"missing: {packages};" in result.stderr
    assert f"apt-get install -y --no-install-recommends {packages}\n" in result.stderr


def test_every_program_present_passes_silently(tmp_path: Path) -> None:
    result = sysdeps("test", tmp_path / "bin", *TEST_PROGRAMS)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_serving_needs_only_espeak_ng(tmp_path: Path) -> None:
    missing = sysdeps("run", tmp_path / "none")
    assert missing.returncode == 1
    assert missing.stderr.endswith("apt-get install -y --no-install-recommends espeak-ng\n")
    present = sysdeps("run", tmp_path / "espeak", "espeak-ng")
    assert (present.returncode, present.stderr) == (0, "")


def test_creating_the_venv_needs_python3_venv_until_the_venv_exists(tmp_path: Path) -> None:
    before = sysdeps("run", tmp_path / "bin", "espeak-ng", python_has_ensurepip=False)
    assert before.returncode == 1
    assert before.stderr.endswith("apt-get install -y --no-install-recommends python3-venv\n")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    fake_program(tmp_path / "venv" / "bin" / "python")
    after = sysdeps("run", tmp_path / "bin2", "espeak-ng", python_has_ensurepip=False)
    assert (after.returncode, after.stderr) == (0, "")


def test_the_tests_need_the_python_headers_for_the_compiled_modules(tmp_path: Path) -> None:
    (tmp_path / "venv" / "bin").mkdir(parents=True)  # the venv exists: ensurepip is not asked
    fake_program(tmp_path / "venv" / "bin" / "python")
    # The fake Python answers "no Python.h" (exit 1) to the header check.
    without = sysdeps("test", tmp_path / "bin", *TEST_PROGRAMS, python_has_ensurepip=False)
    assert without.returncode == 1
    assert without.stderr.endswith("apt-get install -y --no-install-recommends python3-dev\n")
    with_headers = sysdeps("test", tmp_path / "bin2", *TEST_PROGRAMS)
    assert (with_headers.returncode, with_headers.stderr) == (0, "")
    serving = sysdeps("run", tmp_path / "bin3", "espeak-ng", python_has_ensurepip=False)
    assert (serving.returncode, serving.stderr) == (0, "")  # serving runs interpreted without


@pytest.mark.parametrize("target", ["", "serve"])
def test_an_unknown_target_is_a_usage_error(tmp_path: Path, target: str) -> None:
    assert sysdeps(target, tmp_path / "bin").returncode == 2
