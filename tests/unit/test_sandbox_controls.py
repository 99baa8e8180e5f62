"""Masking, access decisions and the signed, chained audit log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetero.framework.policy.schema import PartitionConfig
from hetero.sandbox import AuditError, AuditLog, Principal, decide, mask_text, mask_value, verify
from hetero.sandbox.audit import load_or_create_signing_key, public_key_pem
from hetero.sandbox.masking import valid_bank_card, valid_resident_id

ID = "11010519491231002X"  # the GB 11643 standard's example: the check character is X
CARD = "6222020200112233445"


def test_id_numbers_are_checked_before_masking() -> None:
    assert valid_resident_id(ID)
    assert not valid_resident_id("110105194912310021")  # wrong check character
    assert valid_bank_card("4539578763621486") and not valid_bank_card("4539578763621487")
    text = f"ID {ID}, order 110105194912310021, phone 13812345678, mail zhang.san@example.cn"
    masked = mask_text(text, cleared=set())
    assert "110105********002X" in masked
    assert "110105194912310021" in masked  # not a valid ID: left alone
    assert "138****5678" in masked and "z***@example.cn" in masked


def test_masking_by_role_walks_structures() -> None:
    luhn_card = "4539578763621486"
    output = {"name": "Zhang", "fields": [ID, {"card": luhn_card, "phone": "13812345678"}]}
    clearances = {"id_number": ["case_officer"], "bank_card": [], "mobile": ["case_officer"]}
    clerk = mask_value(output, "clerk", clearances)
    assert clerk["fields"][0] == "110105********002X"
    assert clerk["fields"][1]["card"] == "************1486"
    officer = mask_value(output, "case_officer", clearances)
    assert officer["fields"][0] == ID  # cleared for ID numbers
    assert officer["fields"][1]["card"] == "************1486"  # but not for cards
    assert output["fields"][0] == ID  # the input is not changed


PARTITION = PartitionConfig.model_validate(
    {
        "modality": "image",
        "classification": "secret",
        "cipher": "SM4-GCM",
        "key": "file:id-cards",
        "isolation": "vm",
        "roles": ["case_officer", "auditor"],
        "attribute_rules": [{"attribute": "department", "one_of": ["public-security"]}],
    }
)


def test_access_is_denied_by_default_and_every_decision_names_its_rule() -> None:
    allowed = decide(
        Principal("li", frozenset({"case_officer"}), {"department": "public-security"}),
        "id_cards",
        PARTITION,
    )
    assert allowed.allowed and allowed.rule == "partitions.id_cards.roles"
    no_role = decide(Principal("wang", frozenset({"clerk"})), "id_cards", PARTITION)
    assert not no_role.allowed and "none of the roles" in no_role.reason
    wrong_department = decide(
        Principal("zhao", frozenset({"auditor"}), {"department": "finance"}), "id_cards", PARTITION
    )
    assert not wrong_department.allowed
    assert wrong_department.rule == "partitions.id_cards.attribute_rules[0]"
    missing = decide(Principal("qian", frozenset({"auditor"})), "id_cards", PARTITION)
    assert "department is missing" in missing.reason


def audit_verify(log: Path, public_key: Path) -> subprocess.CompletedProcess[str]:
    """``hetero audit verify`` as a user runs it."""
    hetero = str(Path(sys.executable).parent / "hetero")
    return subprocess.run(
        [hetero, "audit", "verify", str(log), "--public-key", str(public_key)],
        check=False,
        capture_output=True,
        text=True,
    )


@pytest.fixture
def log_files(tmp_path: Path) -> tuple[Path, Path, object]:
    key = load_or_create_signing_key(tmp_path / "audit.key")
    public = tmp_path / "audit.pub"
    public.write_bytes(public_key_pem(key))
    return tmp_path / "audit.log", public, key


def write_records(path: Path, key: object, count: int, algorithm: str = "sha256") -> None:
    log = AuditLog(path, key, algorithm=algorithm, checkpoint_every=5)  # type: ignore[arg-type]
    for index in range(count):
        log.append("access", principal=f"user-{index}", partition="id_cards", decision="allow")
    log.close()


@pytest.mark.parametrize("algorithm", ["sha256", "sm3"])
def test_an_intact_log_verifies_and_reopening_continues_the_chain(
    log_files: tuple[Path, Path, object], algorithm: str
) -> None:
    path, _, key = log_files
    write_records(path, key, 7, algorithm)
    write_records(path, key, 3, algorithm)
    report = verify(path, key.public_key())  # type: ignore[attr-defined]
    assert report.ok and report.records == 10


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        ("edit", "line 4: content does not match its hash"),
        ("delete", "line 4: sequence 4 where 3 was due"),
        ("reorder", "line 3: sequence 3 where 2 was due"),
        ("truncate", "its checkpoint vouches for 10"),
    ],
)
def test_tampering_is_detected_at_the_first_broken_record(
    log_files: tuple[Path, Path, object], tamper: str, expected: str
) -> None:
    path, public, key = log_files
    write_records(path, key, 10)
    lines = path.read_text().splitlines()
    if tamper == "edit":
        record = json.loads(lines[3])
        record["decision"] = "deny"
        lines[3] = json.dumps(record, sort_keys=True)
    elif tamper == "delete":
        del lines[3]
    elif tamper == "reorder":
        lines[2], lines[3] = lines[3], lines[2]
    else:
        lines = lines[:8]
    path.write_text("\n".join(lines) + "\n")
    report = verify(path, key.public_key())  # type: ignore[attr-defined]
    assert not report.ok and expected in report.problem
    result = audit_verify(path, public)
    assert result.returncode == 1 and expected in result.stderr
    with pytest.raises(AuditError, match="refusing to append"):
        AuditLog(path, key)  # type: ignore[arg-type]


def test_another_signer_is_detected_and_the_cli_reports_success(
    log_files: tuple[Path, Path, object], tmp_path: Path
) -> None:
    path, public, key = log_files
    write_records(path, key, 3)
    stranger = load_or_create_signing_key(tmp_path / "other.key")
    assert "bad signature" in verify(path, stranger.public_key()).problem
    ok = audit_verify(path, public)
    assert ok.returncode == 0 and ok.stdout.startswith("ok: 3 records")
    bad_key = audit_verify(path, path)
    assert bad_key.returncode == 2 and "cannot read the public key" in bad_key.stderr
