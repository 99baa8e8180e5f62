"""deploy/systemd/hetero.service, the hardened unit docs/operations.md shows: systemd's own
checker accepts it without a warning, its offline exposure score stays low, and it keeps the
hardening the docs promise. Each check has a control that flips it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

UNIT = Path(__file__).resolve().parents[2] / "deploy/systemd/hetero.service"
DOCS = Path(__file__).resolve().parents[2] / "docs/operations.md"


def _unit_here(tmp_path: Path, text: str) -> Path:
    """The unit with ExecStart pointed at this venv's hetero (verify wants a real program)."""
    path = tmp_path / "hetero.service"
    path.write_text(text.replace("/opt/hetero/venv/bin/hetero", f"{sys.prefix}/bin/hetero"))
    return path


def _verify(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=path.parent,
    )


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    done = _verify(_unit_here(tmp_path, UNIT.read_text()))
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    # the control: a value systemd cannot parse is named, with its line
    broken = UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystem=stricter")
    done = _verify(_unit_here(tmp_path, broken))
    assert "Failed to parse protect system value" in done.stderr, done.stderr


def _exposure_at_most(path: Path, threshold: int) -> bool:
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", f"--threshold={threshold}", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=path.parent,
    )
    return done.returncode == 0


def test_the_offline_exposure_score_is_low(tmp_path: Path) -> None:
    # systemd's scale is 0-10 (threshold in tenths): 2.0 or lower reads "OK"
    assert _exposure_at_most(_unit_here(tmp_path, UNIT.read_text()), 20)
    hardening = (
        "ProtectSystem=",
        "CapabilityBoundingSet=",
        "NoNewPrivileges=",
        "SystemCallFilter=",
        "RestrictNamespaces=",
        "PrivateDevices=",
        "ProtectKernel",
    )
    plain = "".join(
        line for line in UNIT.read_text().splitlines(keepends=True)
        if not line.startswith(hardening)
    )  # fmt: skip
    assert not _exposure_at_most(_unit_here(tmp_path, plain), 20)  # the control


def test_the_unit_keeps_what_the_docs_promise() -> None:
    lines = set(UNIT.read_text().splitlines())
    for line in (
        "User=hetero",
        "ProtectSystem=strict",
        "PrivateTmp=true",
        "NoNewPrivileges=true",
        "CapabilityBoundingSet=",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "ReadWritePaths=/var/lib/hetero /var/cache/hetero /var/log/hetero",
    ):
        assert line in lines, line
    assert "deploy/systemd/hetero.service" in DOCS.read_text()
