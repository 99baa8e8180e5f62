"""The audit log's tail (issue 14, item 4): checkpoints written on open, on an interval and on
close, an anchor the writer only appends to, ``audit verify`` refusing a missing or stale
checkpoint unless told, and canonical JSON (no duplicate keys, strict base64)."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hetero.sandbox.audit import (
    AuditError,
    AuditLog,
    Checkpoint,
    load_or_create_signing_key,
    public_key_pem,
    verify,
)

START = 1_800_000_000.0


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def key(tmp_path: Path) -> Ed25519PrivateKey:
    return load_or_create_signing_key(tmp_path / "audit.key")


@pytest.fixture
def clock() -> Clock:
    return Clock()


def open_log(
    path: Path, key: Ed25519PrivateKey, clock: Clock, anchor: Path | None = None
) -> AuditLog:
    """A log without the heartbeat thread: these tests write checkpoints themselves."""
    return AuditLog(
        path, key, checkpoint_every=5, checkpoint_interval_s=None, anchor=anchor, clock=clock
    )


def append(log: AuditLog, clock: Clock, count: int, step_s: float = 1.0) -> None:
    for index in range(count):
        clock.now += step_s
        log.append("access", principal=f"user-{index}", partition="id_cards", decision="allow")


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".checkpoint")


def hetero(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hetero.framework.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_a_deleted_checkpoint_is_refused_unless_accepted(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock
) -> None:
    path = tmp_path / "audit.log"
    log = open_log(path, key, clock)
    append(log, clock, 12)
    log.close()
    assert verify(path, key.public_key(), now=clock.now).ok  # control: intact
    sidecar(path).unlink()
    report = verify(path, key.public_key(), now=clock.now)
    assert not report.ok and "no checkpoint" in report.problem
    accepted = verify(path, key.public_key(), now=clock.now, allow_missing_checkpoint=True)
    assert accepted.ok and "no checkpoint" in accepted.warning

    public = tmp_path / "audit.pub"
    public.write_bytes(public_key_pem(key))
    refused = hetero("audit", "verify", str(path), "--public-key", str(public))
    assert refused.returncode == 1 and "no checkpoint" in refused.stderr
    waived = hetero(
        "audit", "verify", str(path), "--public-key", str(public), "--allow-missing-checkpoint"
    )
    assert waived.returncode == 0 and waived.stdout.startswith("ok: 12 records")
    assert "WARNING" in waived.stderr


def test_an_older_checkpoint_put_back_is_refused(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock
) -> None:
    path = tmp_path / "audit.log"
    log = open_log(path, key, clock)
    append(log, clock, 10)
    older = sidecar(path).read_text()
    append(log, clock, 10, step_s=30.0)  # 300 s of records the older checkpoint never saw
    log.close()
    assert verify(path, key.public_key(), now=clock.now).ok  # control
    sidecar(path).write_text(older)
    report = verify(path, key.public_key(), now=clock.now)
    assert not report.ok and "older checkpoint was put back" in report.problem
    assert "10 records after it are not vouched for" in report.problem


def test_an_anchor_catches_an_older_checkpoint_at_once_and_a_log_rolled_back_with_it(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock
) -> None:
    path, anchor = tmp_path / "audit.log", tmp_path / "witness" / "audit.anchor"
    anchor.parent.mkdir()
    log = open_log(path, key, clock, anchor)
    append(log, clock, 5)
    older_checkpoint, older_log = sidecar(path).read_text(), path.read_text()
    append(log, clock, 5)  # seconds later: no age check could tell
    log.close()
    assert verify(path, key.public_key(), anchor=anchor, now=clock.now).ok  # control
    sidecar(path).write_text(older_checkpoint)
    put_back = verify(path, key.public_key(), anchor=anchor, now=clock.now)
    assert not put_back.ok and "older than the anchor's newest" in put_back.problem
    assert verify(path, key.public_key(), now=clock.now).ok  # without the anchor: unseen
    path.write_text(older_log)  # log and checkpoint rolled back together: consistent
    rolled_back = verify(path, key.public_key(), anchor=anchor, now=clock.now)
    assert not rolled_back.ok and "its anchor vouches for 10" in rolled_back.problem


def test_records_cut_after_the_last_checkpoint_of_a_crashed_writer(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock
) -> None:
    path = tmp_path / "audit.log"
    log = open_log(path, key, clock)
    append(log, clock, 13)  # checkpoints at 5 and 10; the writer dies before 15
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:10]))  # 3 cut
    later = clock.now + 61
    report = verify(path, key.public_key(), now=later)
    assert not report.ok and "not final" in report.problem
    accepted = verify(path, key.public_key(), now=later, allow_stale_checkpoint=True)
    assert accepted.ok and accepted.records == 10 and "not final" in accepted.warning
    # the stated limit: within max_checkpoint_age_s of the last checkpoint the cut is unseen
    assert verify(path, key.public_key(), now=clock.now + 50).ok


def test_records_cut_after_the_final_checkpoint_are_always_refused(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock
) -> None:
    path = tmp_path / "audit.log"
    log = open_log(path, key, clock)
    append(log, clock, 13)
    log.close()  # vouches for all 13
    assert verify(path, key.public_key(), now=clock.now + 10**6).ok  # final: age is moot
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:12]))
    report = verify(path, key.public_key(), now=clock.now, allow_stale_checkpoint=True)
    assert not report.ok and "checkpoint vouches for 13" in report.problem


def test_a_duplicate_json_key_is_refused(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock
) -> None:
    path = tmp_path / "audit.log"
    log = open_log(path, key, clock)
    append(log, clock, 3)
    log.close()
    lines = path.read_text().splitlines()
    assert '"decision": "allow"' in lines[1]
    # Python's json keeps the last value, so the hash still matches; another reader sees "deny"
    lines[1] = lines[1].replace('"decision": "allow"', '"decision": "deny", "decision": "allow"')
    path.write_text("\n".join(lines) + "\n")
    report = verify(path, key.public_key(), now=clock.now)
    assert not report.ok and report.line == 2 and "duplicate key 'decision'" in report.problem


@pytest.mark.parametrize("junk", ["*", "\n", " ", "é"])
def test_junk_characters_in_a_base64_signature_are_refused(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock, junk: str
) -> None:
    path = tmp_path / "audit.log"
    log = open_log(path, key, clock)
    append(log, clock, 3)
    log.close()
    lines = path.read_text().splitlines()
    record = json.loads(lines[2])
    record["sig"] = record["sig"][:20] + junk + record["sig"][20:]
    lines[2] = json.dumps(record, sort_keys=True, ensure_ascii=False)
    path.write_text("\n".join(lines) + "\n")
    report = verify(path, key.public_key(), now=clock.now)
    assert not report.ok and report.line == 3 and "signature" in report.problem


def test_a_record_respelled_is_refused(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock
) -> None:
    path = tmp_path / "audit.log"
    log = open_log(path, key, clock)
    append(log, clock, 2)
    log.close()
    lines = path.read_text().splitlines()
    lines[0] = json.dumps(json.loads(lines[0]), sort_keys=True, separators=(",", ":"))
    path.write_text("\n".join(lines) + "\n")
    report = verify(path, key.public_key(), now=clock.now)
    assert not report.ok and report.line == 1 and "canonical" in report.problem


def test_a_forged_or_junk_checkpoint_is_refused(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock
) -> None:
    path = tmp_path / "audit.log"
    log = open_log(path, key, clock)
    append(log, clock, 4)
    log.close()
    checkpoint = json.loads(sidecar(path).read_text())
    checkpoint["records"] = 3  # no longer what was signed
    sidecar(path).write_text(json.dumps(checkpoint, sort_keys=True, ensure_ascii=False))
    assert "bad signature" in verify(path, key.public_key(), now=clock.now).problem
    checkpoint["records"] = 4
    checkpoint["sig"] = " " + checkpoint["sig"][1:]
    sidecar(path).write_text(json.dumps(checkpoint, sort_keys=True, ensure_ascii=False))
    assert "base64" in verify(path, key.public_key(), now=clock.now).problem


def test_the_heartbeat_checkpoints_records_without_waiting_for_the_count(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path, key, checkpoint_every=100, checkpoint_interval_s=0.01)
    log.append("access", principal="p", partition="id_cards", decision="allow")
    beat = threading.Event()
    written: list[Checkpoint] = []
    original = log.checkpoint

    def observed() -> Checkpoint:
        written.append(original())
        beat.set()
        return written[-1]

    log.checkpoint = observed  # type: ignore[method-assign]
    assert beat.wait(timeout=60)
    log.close()
    assert written[0].records == 1 and not written[0].final
    report = verify(path, key.public_key())
    assert report.ok and report.vouched == 1


def test_files_are_private_and_the_anchor_only_grows_with_new_records(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock
) -> None:
    path, anchor = tmp_path / "audit.log", tmp_path / "audit.anchor"
    log = open_log(path, key, clock, anchor)
    append(log, clock, 5)
    log.checkpoint()  # nothing new: the sidecar is refreshed, the anchor is not
    log.close()
    for file in (path, sidecar(path), anchor):
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    anchored = [json.loads(line) for line in anchor.read_text().splitlines()]
    assert [(a["records"], a["final"]) for a in anchored] == [(0, False), (5, False), (5, True)]
    assert json.loads(sidecar(path).read_text())["seq"] == 3


def test_reopening_after_a_crash_continues_with_a_warning(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "audit.log"
    log = open_log(path, key, clock)
    append(log, clock, 7)  # no close: a crash
    clock.now += 3600
    with caplog.at_level("WARNING", logger="hetero.sandbox.audit"):
        reopened = open_log(path, key, clock)
    assert "not final" in caplog.text
    append(reopened, clock, 1)
    reopened.close()
    report = verify(path, key.public_key(), now=clock.now)
    assert report.ok and report.records == 8 and report.checkpoint_seq > 2


def test_serving_close_writes_the_final_checkpoint(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    """The product path: ``hetero serve``/``run``/``demo`` close their Serving, which closes
    the compliance gate and with it the audit log."""
    from hetero.framework.policy import load_policy
    from hetero.framework.server import Serving
    from hetero.sandbox.gate import ComplianceGate

    path = tmp_path / "audit.log"
    policy = load_policy(Path(__file__).parents[2] / "policies" / "gov-onprem.yaml")
    gate = ComplianceGate(policy, AuditLog(path, key, checkpoint_interval_s=None))
    gate.record("sandbox_stop", partition="id_cards", stage="id_card_ocr")
    runtime = Serving(policy, gate=gate, use_cache=False)
    runtime.close()
    checkpoint = json.loads(sidecar(path).read_text())
    assert checkpoint["final"] is True and checkpoint["records"] == 1


def test_verify_takes_the_anchor_and_age_from_the_policy(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock
) -> None:
    path, anchor = tmp_path / "audit.log", tmp_path / "audit.anchor"
    log = open_log(path, key, clock, anchor)
    append(log, clock, 5)
    older = sidecar(path).read_text()
    append(log, clock, 1)
    log.close()
    shutil.copy(sidecar(path), tmp_path / "newest")
    sidecar(path).write_text(older)
    public = tmp_path / "audit.pub"
    public.write_bytes(public_key_pem(key))
    policy = tmp_path / "policy.yaml"
    gov = (Path(__file__).parents[2] / "policies" / "gov-onprem.yaml").read_text()
    policy.write_text(gov.replace("audit:", f"audit:\n  anchor: file:{anchor}", 1))
    command = ("audit", "verify", str(path), "--public-key", str(public))
    assert hetero(*command).returncode == 0  # no anchor given: the put-back is unseen
    result = hetero(*command, "--policy", str(policy))
    assert result.returncode == 1 and "older than the anchor's newest" in result.stderr
    shutil.copy(tmp_path / "newest", sidecar(path))
    assert hetero(*command, "--anchor", str(anchor)).returncode == 0


def test_a_log_from_before_checkpoints_had_times_opens_and_continues(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock
) -> None:
    """The first checkpoint format (records, head, sig; unsorted keys) is still read: a log
    written before this change is reopened, not refused."""
    import base64

    path = tmp_path / "audit.log"
    log = open_log(path, key, clock)
    append(log, clock, 3)
    log.close()
    head = json.loads(path.read_text().splitlines()[-1])["hash"]
    body = {"records": 3, "head": head}
    signature = key.sign(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    legacy = {**body, "sig": base64.b64encode(signature).decode()}
    sidecar(path).write_text(json.dumps(legacy))
    report = verify(path, key.public_key(), now=clock.now)
    assert not report.ok and "no time" in report.problem  # it cannot say how old it is
    assert verify(path, key.public_key(), now=clock.now, allow_stale_checkpoint=True).ok
    reopened = open_log(path, key, clock)
    append(reopened, clock, 1)
    reopened.close()
    assert verify(path, key.public_key(), now=clock.now).ok


def test_an_anchor_added_to_an_existing_log_is_created_with_a_warning(
    tmp_path: Path, key: Ed25519PrivateKey, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    path, anchor = tmp_path / "audit.log", tmp_path / "audit.anchor"
    log = open_log(path, key, clock)
    append(log, clock, 2)
    log.close()
    with caplog.at_level("WARNING", logger="hetero.sandbox.audit"):
        anchored = open_log(path, key, clock, anchor)
    assert "did not exist: created" in caplog.text
    anchored.close()
    assert verify(path, key.public_key(), anchor=anchor, now=clock.now).ok
    anchor.unlink()
    with pytest.raises(AuditError, match="anchor not found"):
        verify(path, key.public_key(), anchor=anchor, now=clock.now)
