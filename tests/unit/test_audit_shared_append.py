"""Issue 37, F1's erasure record: a one-off record (``hetero sandbox erase``) reaches the audit
log whether or not a server is writing it, in the chain, and the live writer vouches for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hetero.sandbox.audit import (
    AuditError,
    AuditLog,
    append_record,
    load_or_create_signing_key,
    verify,
)


@pytest.fixture
def key(tmp_path: Path) -> Ed25519PrivateKey:
    return load_or_create_signing_key(tmp_path / "audit.key")


def kinds(path: Path) -> list[str]:
    return [json.loads(line)["kind"] for line in path.read_text().splitlines()]


def test_a_record_beside_a_live_writer_is_chained_and_vouched_for(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "audit.log"
    server = AuditLog(path, key, checkpoint_interval_s=None)
    server.append("sandbox_start", partition="id_cards")
    append_record(path, key, "erasure", partition="id_cards", detail={"objects": ["a"]})
    server.append("key_use", partition="id_cards")  # adopts the erasure record first
    assert server.records == 3
    checkpoint = server.checkpoint()
    assert checkpoint.records == 3
    server.close()
    report = verify(path, key.public_key())
    assert report.ok and report.records == 3, report.problem
    assert kinds(path) == ["sandbox_start", "erasure", "key_use"]


def test_with_no_live_writer_the_record_is_written_checkpointed_and_closed(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path, anchor = tmp_path / "audit.log", tmp_path / "audit.anchor"
    server = AuditLog(path, key, checkpoint_interval_s=None, anchor=anchor)
    server.append("sandbox_start")
    server.close()
    append_record(path, key, "erasure", partition="id_cards", anchor=anchor)
    report = verify(path, key.public_key(), anchor=anchor)
    assert report.ok and report.records == 2 and report.vouched == 2, report.problem


def test_a_broken_log_gets_no_record_from_outside(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    path = tmp_path / "audit.log"
    server = AuditLog(path, key, checkpoint_interval_s=None)
    server.append("sandbox_start")
    with path.open("a") as handle:
        handle.write('{"junk": true}\n')
    with pytest.raises(AuditError, match="refusing to append to a broken log"):
        append_record(path, key, "erasure")
    server.close()
