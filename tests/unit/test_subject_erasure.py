"""Issue 37, F1 (the sandbox's side): what a sandboxed stage stores carries its data subject,
so erasure by subject reaches it, and a repeat of the same input for the same subject keeps one
sealed copy, not one per request."""

from __future__ import annotations

from pathlib import Path

from hetero.framework.policy import load_policy_text
from hetero.sandbox.audit import AuditLog, load_or_create_signing_key
from hetero.sandbox.gate import ComplianceGate
from hetero.sandbox.keyring import FileKeyring
from hetero.sandbox.partition_store import PartitionStore
from hetero.sandbox.runtimes import RuncRuntime
from hetero.sandbox.serving import SandboxedStage, SandboxedStages

POLICY = """version: 1
partitions:
  petitions:
    modality: audio
    classification: confidential
    cipher: AES-256-GCM
    key: file:petitions
    isolation: container
    retention_days: 180
    roles: [case_officer]
stages:
  petition_asr:
    modality: audio
    partition: petitions
    model_version: whisper-tiny.en@1
    variants:
      full: {{flops_per_item: 30 GFLOPS, bytes_per_item: 400 MB}}
routes:
  /v1/petitions/transcribe: petition_asr
qos:
  default_class: routine
  classes:
    routine: {{weight: 1, sla_tier: hour}}
sla_tiers:
  hour: {{deadline_ms: 3600000}}
cache: {{enabled: false}}
audit:
  path: {site}/audit.log
  signing_key: {site}/audit.pem
sandbox:
  runtimes: [runc]
  keyring: {site}/keyring.json
  state_dir: {site}/state
  partitions_dir: {site}/partitions
"""


def stage(site: Path) -> SandboxedStage:
    policy = load_policy_text(POLICY.format(site=site), "subject-erasure-test")
    keyring = FileKeyring.create(site / "keyring.json", {"petitions": 32})
    log = AuditLog(
        site / "audit.log",
        load_or_create_signing_key(site / "audit.pem"),
        checkpoint_interval_s=None,
    )
    owner = SandboxedStages(policy, ComplianceGate(policy, log))
    store = PartitionStore(site / "partitions", "petitions", keyring, "petitions", "AES-256-GCM")
    return SandboxedStage(owner, "petition_asr", "asr", RuncRuntime(site / "runc"), store, 100_000)


def test_stored_inputs_carry_their_subject_and_erasure_reaches_them(tmp_path: Path) -> None:
    sandboxed = stage(tmp_path)
    recording = b"RIFF....a petition recording"
    first = sandboxed._store(recording, "110101199003070000")
    again = sandboxed._store(recording, "110101199003070000")
    other = sandboxed._store(recording, "220202198001010000")
    anonymous = sandboxed._store(b"another recording", None)
    assert first == again  # one sealed copy per subject and content
    assert len({first, other, anonymous}) == 3
    assert sandboxed.store.object_ids() == sorted({first, other, anonymous})
    assert "110101199003070000" not in first  # the id reveals neither subject nor content
    erased = sandboxed.store.erase_subject("110101199003070000")
    assert list(erased) == [first]
    assert sandboxed.store.object_ids() == sorted({other, anonymous})


def test_the_salt_appears_whole_and_a_short_one_is_refused(tmp_path: Path) -> None:
    """Subject tags are keyed by the partition's salt: it is written aside and linked into
    place (never seen half-written), every store reads the same one, and a salt file of the
    wrong size is an error, not an empty key."""
    import pytest

    from hetero.sandbox.partition_store import PartitionStoreError

    sandboxed = stage(tmp_path)
    first = sandboxed._store(b"a recording", "110101199003070000")
    salt = sandboxed.store.meta_directory / ".salt"
    assert len(salt.read_bytes()) == 32
    assert [p.name for p in salt.parent.iterdir() if p.name.startswith(".salt")] == [".salt"]
    store = sandboxed.store
    again = PartitionStore(  # another worker's store of the same partition
        tmp_path / "partitions", "petitions", store.keyring, "petitions", "AES-256-GCM"
    )
    assert again._subject_tag("110101199003070000") == store._subject_tag("110101199003070000")
    assert first in store.object_ids()
    salt.write_bytes(b"")  # as a reader racing the old writer could have seen it
    with pytest.raises(PartitionStoreError, match="0 bytes"):
        sandboxed.store.erase_subject("110101199003070000")
