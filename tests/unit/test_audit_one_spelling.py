"""Issue 37, F2 and F3: audit records have one spelling (a line ends at ``\\n`` and nowhere
else), and an anchor behind the log's own checkpoints is refused by ``verify`` and start-up."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hetero.sandbox.audit import AuditError, AuditLog, load_or_create_signing_key, verify

START = 1_800_000_000.0


@pytest.fixture
def key(tmp_path: Path) -> Ed25519PrivateKey:
    return load_or_create_signing_key(tmp_path / "audit.key")


def open_log(path: Path, key: Ed25519PrivateKey, anchor: Path | None = None) -> AuditLog:
    return AuditLog(
        path,
        key,
        checkpoint_every=5,
        checkpoint_interval_s=None,
        anchor=anchor,
        clock=lambda: START,
    )


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085", "\x1c", "\x0b", "\x0c"])
def test_a_line_separator_inside_an_audited_string_verifies_and_reopens(
    tmp_path: Path, key: Ed25519PrivateKey, separator: str
) -> None:
    path, anchor = tmp_path / "audit.log", tmp_path / "audit.anchor"
    log = open_log(path, key, anchor)
    log.append("key-created", principal=f"ops{separator}team", detail={"name": f"a{separator}b"})
    log.append("access", principal="alice")
    log.close()
    report = verify(path, key.public_key(), anchor=anchor, now=START)
    assert report.ok, report.problem
    assert report.records == 2
    reopened = open_log(path, key, anchor)  # start-up on that log
    reopened.append("access", principal="bob")
    reopened.close()
    assert verify(path, key.public_key(), anchor=anchor, now=START).records == 3


def test_a_log_respelled_with_crlf_does_not_verify(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    path = tmp_path / "audit.log"
    log = open_log(path, key)
    for index in range(3):
        log.append("access", principal=f"user-{index}")
    log.close()
    assert verify(path, key.public_key(), now=START).ok  # control
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    report = verify(path, key.public_key(), now=START)
    assert not report.ok and report.line == 1
    with pytest.raises(AuditError, match="broken log"):
        open_log(path, key)


def test_an_emptied_anchor_is_refused_by_verify_and_start_up(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path, anchor = tmp_path / "audit.log", tmp_path / "audit.anchor"
    log = open_log(path, key, anchor)
    for index in range(11):
        log.append("access", principal=f"user-{index}")
    log.close()
    assert verify(path, key.public_key(), anchor=anchor, now=START).ok  # control
    anchor.write_bytes(b"")
    report = verify(path, key.public_key(), anchor=anchor, now=START)
    assert not report.ok and "anchor is behind the log's checkpoint" in report.problem
    with pytest.raises(AuditError, match="anchor is behind"):
        open_log(path, key, anchor)


def test_an_anchor_rolled_back_to_an_older_checkpoint_is_refused(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path, anchor = tmp_path / "audit.log", tmp_path / "audit.anchor"
    log = open_log(path, key, anchor)
    for index in range(5):
        log.append("access", principal=f"user-{index}")
    older = anchor.read_bytes()
    for index in range(6):
        log.append("access", principal=f"user-{index}")
    log.close()
    anchor.write_bytes(older)
    report = verify(path, key.public_key(), anchor=anchor, now=START)
    assert not report.ok and "vouches for 11 records, the anchor for 5" in report.problem
