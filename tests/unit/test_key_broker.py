"""Issue 37: a partition's key goes only to a sandbox whose evidence verifies against the
partition's policy and binds the sandbox's own key; every release and refusal is audited.

The positive case needs evidence carrying a fresh nonce and key, which real (fixed) evidence
cannot: it uses the SIMULATED TEE of ``tests/support/simulated_tee.py`` through the real SEV-SNP
verifier, with the simulated roots passed explicitly. Real evidence shows the refusals."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from simulated_tee import SimulatedSnpTee

from hetero.framework.policy.schema import AttestationPolicy, PartitionConfig
from hetero.sandbox.audit import AuditLog, load_or_create_signing_key, verify
from hetero.sandbox.key_broker import (
    KeyBroker,
    KeyReleaseRefusedError,
    ReleaseRequest,
    binding,
    open_released_key,
)

MEASUREMENT = bytes.fromhex("5a" * 48)
NOW = datetime.datetime(2025, 6, 1, tzinfo=datetime.UTC).timestamp()
DATA = Path(__file__).resolve().parents[1] / "data" / "attestation" / "amd-sev-snp"


def partition(attestation: AttestationPolicy | None) -> PartitionConfig:
    return PartitionConfig(
        modality="image",
        classification="secret",
        cipher="SM4-GCM",
        key="file:id-cards",
        isolation="container",
        roles=("case_officer",),
        attestation=attestation,
    )


@pytest.fixture(scope="module")
def tee() -> SimulatedSnpTee:
    return SimulatedSnpTee()


@pytest.fixture
def log(tmp_path: Path) -> AuditLog:
    key = load_or_create_signing_key(tmp_path / "audit.pem")
    return AuditLog(tmp_path / "audit.log", key, checkpoint_interval_s=None)


def broker(log: AuditLog, tee: SimulatedSnpTee) -> KeyBroker:
    policy = AttestationPolicy(kinds=("sev-snp",), measurements=(MEASUREMENT.hex(),))
    return KeyBroker(
        {"id_cards": partition(policy), "open_data": partition(None)},
        log,
        clock=lambda: NOW,
        amd_roots=tee.roots,
    )


def sandbox_key() -> tuple[X25519PrivateKey, bytes]:
    private = X25519PrivateKey.generate()
    public = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return private, public


def records(log: AuditLog) -> list[dict[str, object]]:
    lines = log.path.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "key_release"]


def test_an_attested_sandbox_gets_its_partitions_key_and_it_is_audited(
    log: AuditLog, tee: SimulatedSnpTee
) -> None:
    keys = broker(log, tee)
    private, public = sandbox_key()
    nonce = keys.challenge("id_cards")
    evidence = tee.report(binding(nonce, public), MEASUREMENT)
    data_key = os.urandom(32)
    request = ReleaseRequest("sbx-1", "sev-snp", evidence, public, nonce, (tee.vcek_der,))
    sealed = keys.release("id_cards", request, data_key)
    assert open_released_key(private, sealed, "id_cards", "sbx-1") == data_key
    assert data_key not in sealed.ciphertext
    (record,) = records(log)
    assert record["decision"] == "allow" and record["partition"] == "id_cards"
    assert record["detail"]["measurement"] == MEASUREMENT.hex()  # type: ignore[index]
    with pytest.raises(KeyReleaseRefusedError, match="not issued by this broker or was used"):
        keys.release("id_cards", request, data_key)  # the nonce is single-use: no replay


def test_a_wrong_measurement_gets_no_key_and_is_audited(
    log: AuditLog, tee: SimulatedSnpTee
) -> None:
    keys = broker(log, tee)
    _, public = sandbox_key()
    nonce = keys.challenge("id_cards")
    evidence = tee.report(binding(nonce, public), bytes(48))
    request = ReleaseRequest("sbx-2", "sev-snp", evidence, public, nonce, (tee.vcek_der,))
    with pytest.raises(KeyReleaseRefusedError, match="is not one partition 'id_cards' allows"):
        keys.release("id_cards", request, os.urandom(32))
    (record,) = records(log)
    assert record["decision"] == "deny" and "allows" in record["detail"]["reason"]  # type: ignore[index]


def test_evidence_bound_to_another_key_or_debuggable_gets_no_key(
    log: AuditLog, tee: SimulatedSnpTee
) -> None:
    keys = broker(log, tee)
    _, public = sandbox_key()
    _, thief = sandbox_key()
    nonce = keys.challenge("id_cards")
    evidence = tee.report(binding(nonce, public), MEASUREMENT)
    stolen = ReleaseRequest("sbx-3", "sev-snp", evidence, thief, nonce, (tee.vcek_der,))
    with pytest.raises(KeyReleaseRefusedError, match="does not match the nonce"):
        keys.release("id_cards", stolen, os.urandom(32))
    nonce = keys.challenge("id_cards")
    debuggable = tee.report(binding(nonce, public), MEASUREMENT, debug=True)
    request = ReleaseRequest("sbx-4", "sev-snp", debuggable, public, nonce, (tee.vcek_der,))
    with pytest.raises(KeyReleaseRefusedError, match="debuggable"):
        keys.release("id_cards", request, os.urandom(32))
    assert [r["decision"] for r in records(log)] == ["deny", "deny"]


def test_a_sandbox_without_evidence_that_verifies_gets_no_key(
    log: AuditLog, tee: SimulatedSnpTee
) -> None:
    """Genuine AMD evidence, but not bound to this nonce and key; and a partition with no
    attestation policy, which the broker never serves."""
    keys = broker(log, tee)
    keys.amd_roots = None  # the real pinned roots
    _, public = sandbox_key()
    nonce = keys.challenge("id_cards")
    genuine = (DATA / "trustee/test-report.bin").read_bytes()
    vcek = (DATA / "trustee/test-vcek.der").read_bytes()
    request = ReleaseRequest("sbx-5", "sev-snp", genuine, public, nonce, (vcek,))
    with pytest.raises(KeyReleaseRefusedError, match="does not match the nonce"):
        keys.release("id_cards", request, os.urandom(32))
    nonce = keys.challenge("open_data")
    request = ReleaseRequest("sbx-6", "sev-snp", genuine, public, nonce, (vcek,))
    with pytest.raises(KeyReleaseRefusedError, match="no attestation policy"):
        keys.release("open_data", request, os.urandom(32))
    with pytest.raises(KeyReleaseRefusedError, match="unreadable evidence"):
        nonce = keys.challenge("id_cards")
        keys.release("id_cards", ReleaseRequest("sbx-7", "sev-snp", b"junk", public, nonce), b"k")
    log.close()
    assert [r["decision"] for r in records(log)] == ["deny", "deny", "deny"]
    assert verify(log.path, log.key.public_key()).ok


def test_the_simulated_tee_is_refused_against_the_pinned_roots(
    log: AuditLog, tee: SimulatedSnpTee
) -> None:
    keys = broker(log, tee)
    keys.amd_roots = None
    _, public = sandbox_key()
    nonce = keys.challenge("id_cards")
    evidence = tee.report(binding(nonce, public), MEASUREMENT)
    request = ReleaseRequest("sbx-8", "sev-snp", evidence, public, nonce, (tee.vcek_der,))
    with pytest.raises(KeyReleaseRefusedError, match="not signed by the AMD Milan ASK"):
        keys.release("id_cards", request, os.urandom(32))
