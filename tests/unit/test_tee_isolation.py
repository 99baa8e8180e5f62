"""Issue 37: a partition with ``isolation: tee`` on a host without a TEE fails closed: no
runtime is chosen for it, ``hetero sandbox check`` says why, and its stages are not served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetero.framework.cli import main
from hetero.framework.policy import load_policy
from hetero.sandbox.runtimes import BwrapRuntime, IsolationLevel, RuncRuntime
from hetero.sandbox.selection import IsolationUnsatisfiableError, choose_runtime, tee_devices

GOV = Path(__file__).resolve().parents[2] / "policies" / "gov-onprem.yaml"


def tee_policy(tmp_path: Path) -> Path:
    text = GOV.read_text().replace("    isolation: vm\n", "    isolation: tee\n", 1)
    path = tmp_path / "tee.yaml"
    path.write_text(text)
    return path


def test_tee_is_stronger_than_a_vm_and_no_runtime_here_gives_it(tmp_path: Path) -> None:
    assert IsolationLevel.parse("tee") > IsolationLevel.VM
    if tee_devices():
        pytest.skip(f"this host has TEE devices: {tee_devices()}")
    policy = load_policy(tee_policy(tmp_path))
    partition = policy.spec.partitions["id_cards"]
    runtimes = [RuncRuntime(tmp_path / "runc"), BwrapRuntime(tmp_path / "bwrap")]
    with pytest.raises(IsolationUnsatisfiableError, match="requires tee isolation") as refused:
        choose_runtime("id_cards", partition, runtimes)
    assert "no TEE on this host" in str(refused.value)
    assert choose_runtime("public_documents", policy.spec.partitions["public_documents"], runtimes)


def test_sandbox_check_reports_the_tee_partition_not_satisfied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["sandbox", "check", "--policy", str(tee_policy(tmp_path)), "--json"])
    report = json.loads(capsys.readouterr().out)
    partitions = {p["name"]: p for p in report["partitions"]}
    assert code == 1 and partitions["id_cards"]["runtime"] is None
    assert any("requires tee isolation" in p for p in partitions["id_cards"]["problems"])


def test_the_tee_partitions_stage_gets_no_sandbox(tmp_path: Path) -> None:
    """Serving asks :class:`SandboxedStages` for the stage's plugin and, on this refusal, does
    not serve the stage and shows the reason in ``/ready`` (``Serving._plugin``)."""
    from hetero.sandbox.audit import AuditLog, load_or_create_signing_key
    from hetero.sandbox.gate import ComplianceGate
    from hetero.sandbox.serving import SandboxedStages

    text = tee_policy(tmp_path).read_text()
    for old in ("/var/lib/hetero/sandbox", "/var/lib/hetero/partitions"):
        text = text.replace(old, str(tmp_path / Path(old).name))
    (tmp_path / "tee.yaml").write_text(text)
    policy = load_policy(tmp_path / "tee.yaml")
    log = AuditLog(
        tmp_path / "audit.log",
        load_or_create_signing_key(tmp_path / "audit.pem"),
        checkpoint_interval_s=None,
    )
    stages = SandboxedStages(policy, ComplianceGate(policy, log))
    with pytest.raises(IsolationUnsatisfiableError, match="requires tee isolation"):
        stages.plugin("id_card_ocr", "ocr")
    log.close()
