"""The compliance gate (access decisions audited, masking from the policy), erasure and
retention, fail-closed runtime selection and ``hetero sandbox check``."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hetero.framework.errors import PolicyValidationError
from hetero.framework.policy import load_policy
from hetero.sandbox.access import Principal
from hetero.sandbox.audit import AuditLog, load_or_create_signing_key, verify
from hetero.sandbox.gate import AccessDeniedError, ComplianceGate
from hetero.sandbox.keyring import FileKeyring
from hetero.sandbox.partition_store import PartitionStore
from hetero.sandbox.runtimes import BwrapRuntime, RuncRuntime
from hetero.sandbox.selection import IsolationUnsatisfiableError, choose_runtime

GOV = Path(__file__).parents[2] / "policies" / "gov-onprem.yaml"
WEDNESDAY_NOON_BEIJING = datetime(2026, 11, 25, 4, 0, tzinfo=UTC)
SUNDAY_NOON_BEIJING = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)
OFFICER = Principal(
    "li.wei",
    frozenset({"case_officer"}),
    {"department": "public-security", "clearance": "secret", "purpose": "case-handling"},
)


def policy_text(isolation: str, runtimes: str, keyring: Path, state_dir: Path | None = None) -> str:
    return f"""version: 1
partitions:
  id_cards:
    modality: image
    classification: secret
    cipher: SM4-GCM
    key: file:id-cards
    isolation: {isolation}
    roles: [case_officer]
stages:
  id_card_ocr:
    modality: image
    partition: id_cards
    model_version: pp-ocrv4@1
    variants:
      full: {{flops_per_item: 1 GFLOPS, bytes_per_item: 1 MB}}
qos:
  default_class: routine
  classes:
    routine: {{weight: 1, sla_tier: hour}}
sla_tiers:
  hour: {{deadline_ms: 3600000}}
sandbox:
  runtimes: {runtimes}
  keyring: {keyring}
  state_dir: {state_dir or keyring.parent / "state"}
"""


@pytest.fixture
def gate(tmp_path: Path) -> ComplianceGate:
    audit = AuditLog(tmp_path / "audit.log", load_or_create_signing_key(tmp_path / "k.pem"))
    return ComplianceGate(load_policy(GOV), audit, clock=lambda: WEDNESDAY_NOON_BEIJING)


def records(gate: ComplianceGate) -> list[dict[str, object]]:
    return [json.loads(line) for line in gate.audit.path.read_text().splitlines()]


def test_an_officer_with_every_attribute_is_allowed_and_the_decision_is_audited(
    gate: ComplianceGate,
) -> None:
    gate.authorize(OFFICER, "id_card_ocr", "req-1")
    (record,) = records(gate)
    assert record["decision"] == "allow" and record["partition"] == "id_cards"
    assert record["detail"] == {
        "stage": "id_card_ocr",
        "request": "req-1",
        "rule": "partitions.id_cards.roles",
        "reason": "li.wei holds ['case_officer'] and meets 2 attribute rule(s)",
    }
    gate.authorize(OFFICER, "summarise", "req-2")  # no partition: nothing to decide or audit
    assert len(records(gate)) == 1
    assert verify(gate.audit.path, gate.audit.key.public_key()).ok


@pytest.mark.parametrize(
    ("principal", "rule"),
    [
        (None, "default-deny"),
        (Principal("clerk", frozenset({"clerk"})), "partitions.id_cards.roles"),
        (
            Principal("li", OFFICER.roles, {**OFFICER.attributes, "department": "tax"}),
            "partitions.id_cards.attribute_rules[0]",
        ),
        (
            Principal("li", OFFICER.roles, {**OFFICER.attributes, "clearance": "confidential"}),
            "partitions.id_cards.attribute_rules[1]",
        ),
        (
            Principal("li", OFFICER.roles, {**OFFICER.attributes, "purpose": "marketing"}),
            "partitions.id_cards.purposes",
        ),
    ],
)
def test_a_principal_without_the_role_or_attributes_is_refused_and_the_refusal_is_audited(
    gate: ComplianceGate, principal: Principal | None, rule: str
) -> None:
    with pytest.raises(AccessDeniedError, match=rule.replace("[", r"\[").replace("]", r"\]")):
        gate.authorize(principal, "id_card_ocr", "req-9")
    (record,) = records(gate)
    assert record["decision"] == "deny"
    assert isinstance(record["detail"], dict) and record["detail"]["rule"] == rule


def test_access_outside_the_partitions_hours_is_refused(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.log", load_or_create_signing_key(tmp_path / "k.pem"))
    weekend = ComplianceGate(load_policy(GOV), audit, clock=lambda: SUNDAY_NOON_BEIJING)
    with pytest.raises(AccessDeniedError, match="access_hours"):
        weekend.authorize(OFFICER, "id_card_ocr", "req-3")


def test_outputs_are_masked_by_the_policys_rules(gate: ComplianceGate) -> None:
    output = {"text": "ID 11010519491231002X tel 13812345678 card 4539578763621486"}
    clerk = gate.mask(Principal("c", frozenset({"clerk"})), "document_ocr", output)
    officer = gate.mask(OFFICER, "id_card_ocr", output)
    auditor = gate.mask(Principal("a", frozenset({"auditor"})), "id_card_ocr", output)
    assert clerk["text"] == "ID 110105********002X tel 138****5678 card ************1486"
    assert officer["text"] == "ID 110105********002X tel 13812345678 card ************1486"
    assert auditor["text"].startswith("ID 11010519491231002X")  # auditors see ID numbers


def test_erasing_a_data_subject_removes_their_objects_and_names_the_cache_keys(
    tmp_path: Path,
) -> None:
    keyring = FileKeyring.create(tmp_path / "keys.json", {"k": 32})
    store = PartitionStore(tmp_path / "parts", "id_cards", keyring, "k", "AES-256-GCM")
    store.put("a-front", b"front", subject="11010519491231002X")
    store.put("a-back", b"back", subject="11010519491231002X")
    store.put("b-front", b"other person", subject="440524188001010014")
    erased = store.erase_subject("11010519491231002X")
    assert sorted(erased) == ["a-back", "a-front"]
    assert all(digest is not None and len(digest) == 64 for digest in erased.values())
    assert store.object_ids() == ["b-front"]
    assert store.erase_subject("11010519491231002X") == {}
    meta = b"".join(p.read_bytes() for p in store.meta_directory.iterdir())
    assert b"440524188001010014" not in meta  # only a keyed hash of the subject is kept


def test_retention_expires_old_objects_only(tmp_path: Path) -> None:
    keyring = FileKeyring.create(tmp_path / "keys.json", {"k": 32})
    store = PartitionStore(tmp_path / "parts", "petitions", keyring, "k", "AES-256-GCM")
    now = 1_800_000_000.0
    store.put("old", b"x", now=now - 31 * 86_400)
    store.put("new", b"y", now=now - 29 * 86_400)
    assert store.expire(30, now=now) == ["old"]
    assert store.object_ids() == ["new"]


def test_a_partition_that_requires_a_vm_never_runs_on_a_weaker_runtime(tmp_path: Path) -> None:
    policy = load_policy(GOV)
    runtimes = [RuncRuntime(tmp_path / "runc"), BwrapRuntime(tmp_path / "bwrap")]
    with pytest.raises(IsolationUnsatisfiableError, match=r"requires vm isolation.*add kata"):
        choose_runtime("id_cards", policy.spec.partitions["id_cards"], runtimes)
    container = policy.spec.partitions["public_documents"]
    assert choose_runtime("public_documents", container, runtimes).name == "runc"


def hetero(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hetero.framework.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def sandbox_check(policy: Path) -> tuple[int, dict[str, Any]]:
    """``hetero sandbox check --json``: the exit code and the report."""
    result = hetero("sandbox", "check", "--policy", str(policy), "--json")
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_sandbox_check_says_honestly_what_this_host_cannot_satisfy() -> None:
    returncode, report = sandbox_check(GOV)
    assert returncode == 1 and report["ok"] is False
    partitions = {p["name"]: p for p in report["partitions"]}
    assert partitions["id_cards"]["runtime"] is None
    assert any("requires vm isolation" in problem for problem in partitions["id_cards"]["problems"])
    runtimes = {r["name"]: r["isolation"] for r in report["runtimes"]}
    assert runtimes["runc"] == "container" and runtimes["kata"] == "vm"
    human = hetero("sandbox", "check", "--policy", str(GOV))
    assert human.returncode == 1 and human.stdout, human.stderr  # the tables, for people


def test_sandbox_check_passes_when_runtime_and_key_are_present(
    tmp_path: Path, reachable: Path
) -> None:
    FileKeyring.create(tmp_path / "keyring.json", {"id-cards": 16})
    policy = tmp_path / "site.yaml"
    policy.write_text(
        policy_text("container", "[runc]", tmp_path / "keyring.json", reachable / "state")
    )
    returncode, report = sandbox_check(policy)
    assert returncode == 0, report
    (partition,) = report["partitions"]
    assert partition["ok"] and partition["runtime"] == "runc" and partition["problems"] == []
    assert hetero("sandbox", "check", "--policy", str(policy)).returncode == 0
    missing_key = tmp_path / "missing.yaml"
    missing_key.write_text(
        policy_text("container", "[runc]", tmp_path / "nowhere.json", reachable / "state")
    )
    returncode, report = sandbox_check(missing_key)
    assert returncode == 1
    (partition,) = report["partitions"]
    assert not partition["ok"] and partition["runtime"] == "runc"
    assert partition["key"] == {
        "ok": False,
        "detail": f"{tmp_path / 'nowhere.json'}: keyring file not found",
    }


def test_sandbox_check_names_a_state_directory_runc_could_not_mount_from(
    tmp_path: Path, reachable: Path
) -> None:
    FileKeyring.create(tmp_path / "keyring.json", {"id-cards": 16})
    private = reachable / "home"
    private.mkdir(mode=0o700)
    policy = tmp_path / "site.yaml"
    policy.write_text(
        policy_text("container", "[runc]", tmp_path / "keyring.json", private / "state")
    )
    returncode, report = sandbox_check(policy)
    (partition,) = report["partitions"]
    assert returncode == 1 and not partition["ok"] and partition["runtime"] == "runc"
    (problem,) = partition["problems"]
    assert f"cannot pass {private} (mode 0700)" in problem and "sandbox.state_dir" in problem
    gvisor = tmp_path / "gvisor.yaml"  # runsc mounts the root as the host's root: no problem
    gvisor.write_text(
        policy_text("container", "[gvisor]", tmp_path / "keyring.json", private / "state")
    )
    returncode, report = sandbox_check(gvisor)
    assert returncode == 0 and report["partitions"][0]["runtime"] == "gvisor", report
    private.chmod(0o711)  # the control: the same policy passes once others may search it
    assert sandbox_check(policy)[0] == 0


def test_a_policy_naming_an_unknown_runtime_is_refused_with_its_line(tmp_path: Path) -> None:
    policy = tmp_path / "bad.yaml"
    policy.write_text(policy_text("container", "[runc, firecracker]", tmp_path / "k.json"))
    with pytest.raises(PolicyValidationError) as caught:
        load_policy(policy)
    assert "sandbox.runtimes" in str(caught.value) and "bad.yaml:" in str(caught.value)
    result = hetero("sandbox", "check", "--policy", str(policy))
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_a_malformed_audit_file_is_reported_at_its_line(tmp_path: Path) -> None:
    key = load_or_create_signing_key(tmp_path / "k.pem")
    log = AuditLog(tmp_path / "audit.log", key)
    log.append("access", principal="p", partition="id_cards", decision="allow")
    log.append("access", principal="q", partition="id_cards", decision="deny")
    log.close()
    lines = (tmp_path / "audit.log").read_text().splitlines()
    (tmp_path / "audit.log").write_text(lines[0] + "\n{not json\n")
    report = verify(tmp_path / "audit.log", key.public_key())
    assert not report.ok and report.line == 2 and "unreadable record" in report.problem
    from hetero.sandbox.audit import public_key_pem

    (tmp_path / "pub.pem").write_bytes(public_key_pem(key))
    result = hetero(
        "audit", "verify", str(tmp_path / "audit.log"), "--public-key", str(tmp_path / "pub.pem")
    )
    assert result.returncode == 1 and "line 2" in result.stderr and "Traceback" not in result.stderr


def test_an_object_sealed_under_an_unknown_key_name_is_a_clear_error(tmp_path: Path) -> None:
    from hetero.sandbox.envelope import open_object, seal_object
    from hetero.sandbox.keyring import KeyringError

    sealing = FileKeyring.create(tmp_path / "a.json", {"id-cards": 32})
    other = FileKeyring.create(tmp_path / "b.json", {"voice": 32})
    blob = seal_object(sealing, "id-cards", "AES-256-GCM", "id_cards", "x", b"data")
    with pytest.raises(KeyringError, match="id-cards"):
        open_object(other, "id_cards", "x", blob)


def test_sandbox_erase_removes_the_subjects_objects_and_their_cached_features(
    tmp_path: Path,
) -> None:
    from hetero.cache.feature_cache import FeatureCache
    from hetero.cache.keys import feature_key

    FileKeyring.create(tmp_path / "keyring.json", {"id-cards": 16})
    policy = tmp_path / "site.yaml"
    policy.write_text(
        policy_text("container", "[runc]", tmp_path / "keyring.json")
        + f"  partitions_dir: {tmp_path / 'parts'}\n"
        + f"cache: {{redis: {{enabled: false}}, disk: {{path: {tmp_path / 'features'}}}}}\n"
        + f"audit: {{path: {tmp_path / 'audit.log'}, signing_key: {tmp_path / 'audit.pem'}}}\n"
    )
    spec = load_policy(policy).spec
    keyring = FileKeyring(tmp_path / "keyring.json")
    store = PartitionStore(tmp_path / "parts", "id_cards", keyring, "id-cards", "SM4-GCM")
    store.put("front", b"scan of a card", subject="11010519491231002X")
    store.put("other", b"someone else", subject="440524188001010014")
    cache = FeatureCache(spec.cache)
    derived = feature_key(b"scan of a card", stage="id_card_ocr", model_version="pp-ocrv4@1")
    kept = feature_key(b"someone else", stage="id_card_ocr", model_version="pp-ocrv4@1")
    cache.put(derived, {"text": "derived"})
    cache.put(kept, {"text": "kept"})
    cache.close()
    result = hetero(
        "sandbox", "erase", "--policy", str(policy), "--partition", "id_cards",
        "--subject", "11010519491231002X",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "erased 1 object(s)" in result.stdout and "front" in result.stdout
    assert store.object_ids() == ["other"]
    cache = FeatureCache(spec.cache)
    assert cache.get(derived) is None and cache.get(kept) == {"text": "kept"}
    cache.close()
    (record,) = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert record["kind"] == "erasure" and record["partition"] == "id_cards"
    assert record["detail"]["objects"] == ["front"] and record["detail"]["cache_entries"] == 1
    assert "11010519491231002X" not in (tmp_path / "audit.log").read_text()
