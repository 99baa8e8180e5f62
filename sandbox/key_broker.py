"""Keys only for attested sandboxes.

A partition with an ``attestation`` policy gets its data keys released to a sandbox only after
that sandbox proves, with hardware evidence, what it runs and that it holds the key the data
key is sealed to:

1. the broker hands out a single-use nonce (:meth:`KeyBroker.challenge`);
2. the sandbox, inside its TEE, makes an X25519 key pair and asks its hardware for a report
   whose report data is ``SHA-512(nonce || public key)`` (:func:`binding`);
3. :meth:`KeyBroker.release` verifies the evidence offline (pinned vendor roots, the
   partition's measurement policy, :mod:`hetero.sandbox.attestation`), checks the binding,
   and seals the data key to that public key (X25519, HKDF-SHA256, AES-256-GCM), so only the
   attested sandbox can open it (:func:`open_released_key`).

Every release and every refusal is an audit record (``key_release``, decision ``allow`` or
``deny``, with the reason, evidence kind, measurement and chip). A refusal raises
:class:`KeyReleaseRefusedError`.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from hetero.framework.errors import HeteroError
from hetero.framework.policy.schema import PartitionConfig
from hetero.sandbox.attestation import (
    AttestationError,
    EndorsementCache,
    Verdict,
    verify_evidence,
)
from hetero.sandbox.audit import AuditLog

__all__ = [
    "NONCE_TTL_S",
    "KeyBroker",
    "KeyReleaseRefusedError",
    "ReleaseRequest",
    "SealedKey",
    "binding",
    "open_released_key",
]

NONCE_BYTES = 32
NONCE_TTL_S = 120.0
_INFO = b"hetero key release v1"


class KeyReleaseRefusedError(HeteroError, PermissionError):
    """No key for this sandbox; ``reason`` says why (also in the audit log)."""

    def __init__(self, reason: str, verdict: Verdict | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.verdict = verdict


def binding(nonce: bytes, public_key: bytes) -> bytes:
    """The report data that binds a report to this nonce and this sandbox key."""
    return hashlib.sha512(nonce + public_key).digest()


@dataclass(frozen=True, slots=True)
class ReleaseRequest:
    """What a sandbox sends to get its partition's key.

    Attributes:
        sandbox_id: The sandbox asking (for the audit record).
        kind: Evidence kind (``sev-snp``, ``tdx``, ``sgx``, ``csv``).
        evidence: The report or quote, with report data = :func:`binding` of the nonce and
            ``public_key``.
        public_key: The sandbox's own X25519 public key (32 bytes), made inside the TEE.
        nonce: The broker's challenge.
        certs: What comes with the evidence (VCEK or VLEK, HSK and CEK).
        collateral: Intel collateral JSON.
    """

    sandbox_id: str
    kind: str
    evidence: bytes
    public_key: bytes
    nonce: bytes
    certs: tuple[bytes, ...] = ()
    collateral: bytes | None = None


@dataclass(frozen=True, slots=True)
class SealedKey:
    """A data key sealed to one sandbox's public key."""

    ephemeral_public_key: bytes
    nonce: bytes
    ciphertext: bytes


def _aad(partition: str, sandbox_id: str) -> bytes:
    return f"{partition}\0{sandbox_id}".encode()


def _derive(shared: bytes, ephemeral: bytes, recipient: bytes) -> bytes:
    return HKDF(hashes.SHA256(), 32, salt=ephemeral + recipient, info=_INFO).derive(shared)


def _seal(data_key: bytes, public_key: bytes, partition: str, sandbox_id: str) -> SealedKey:
    recipient = X25519PublicKey.from_public_bytes(public_key)
    ephemeral = X25519PrivateKey.generate()
    ephemeral_public = ephemeral.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    key = _derive(ephemeral.exchange(recipient), ephemeral_public, public_key)
    nonce = os.urandom(12)
    sealed = AESGCM(key).encrypt(nonce, data_key, _aad(partition, sandbox_id))
    return SealedKey(ephemeral_public, nonce, sealed)


def open_released_key(
    private_key: X25519PrivateKey, sealed: SealedKey, partition: str, sandbox_id: str
) -> bytes:
    """The sandbox's side: the data key, opened with its own private key."""
    own = private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    shared = private_key.exchange(X25519PublicKey.from_public_bytes(sealed.ephemeral_public_key))
    key = _derive(shared, sealed.ephemeral_public_key, own)
    return AESGCM(key).decrypt(sealed.nonce, sealed.ciphertext, _aad(partition, sandbox_id))


@dataclass(slots=True)
class _Challenge:
    partition: str
    expires: float


@dataclass
class KeyBroker:
    """Releases partition data keys to attested sandboxes only, and audits every decision.

    Args:
        partitions: The policy's partitions; those without ``attestation`` get no key here.
        audit: Where releases and refusals are recorded.
        clock: Seconds since the epoch; evidence is judged at this moment.
        cache: Chain and collateral results kept per chip and TCB.
        amd_roots: Replaces the pinned AMD roots; only a simulated TEE in tests sets it.
    """

    partitions: Mapping[str, PartitionConfig]
    audit: AuditLog
    clock: Callable[[], float] = time.time
    cache: EndorsementCache = field(default_factory=EndorsementCache)
    amd_roots: Mapping[str, bytes] | None = None
    _challenges: dict[bytes, _Challenge] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def challenge(self, partition: str) -> bytes:
        """A fresh single-use nonce for a sandbox of ``partition`` (valid 120 s)."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        now = self.clock()
        with self._lock:
            for stale in [n for n, c in self._challenges.items() if c.expires < now]:
                del self._challenges[stale]
            self._challenges[nonce] = _Challenge(partition, now + NONCE_TTL_S)
        return nonce

    def release(self, partition: str, request: ReleaseRequest, data_key: bytes) -> SealedKey:
        """``data_key`` sealed to the requesting sandbox, if its evidence verifies against the
        partition's policy and binds its key to a nonce of ours; else
        :class:`KeyReleaseRefusedError`. Audited either way."""
        try:
            verdict = self._verify(partition, request)
        except KeyReleaseRefusedError as refusal:
            self._record(partition, request, "deny", refusal.reason, refusal.verdict)
            raise
        self._record(partition, request, "allow", "", verdict)
        return _seal(data_key, request.public_key, partition, request.sandbox_id)

    def _verify(self, partition: str, request: ReleaseRequest) -> Verdict:
        config = self.partitions.get(partition)
        if config is None:
            raise KeyReleaseRefusedError(f"no partition {partition!r}")
        if config.attestation is None:
            raise KeyReleaseRefusedError(
                f"partition {partition!r} has no attestation policy: this broker releases "
                "keys to attested sandboxes only"
            )
        now = self.clock()
        with self._lock:
            issued = self._challenges.pop(request.nonce, None)
        if issued is None:
            raise KeyReleaseRefusedError("the nonce was not issued by this broker or was used")
        if issued.partition != partition or issued.expires < now:
            raise KeyReleaseRefusedError("the nonce is for another partition or has expired")
        if len(request.public_key) != 32:
            raise KeyReleaseRefusedError("the sandbox key is not an X25519 public key")
        try:
            verdict = verify_evidence(
                request.kind,
                request.evidence,
                as_of=datetime.datetime.fromtimestamp(now, datetime.UTC),
                certs=request.certs,
                collateral=request.collateral,
                report_data=binding(request.nonce, request.public_key),
                policy=config.attestation,
                partition=partition,
                cache=self.cache,
                amd_roots=self.amd_roots,
            )
        except AttestationError as err:
            raise KeyReleaseRefusedError(f"unreadable evidence: {err}") from None
        if not verdict.verified:
            raise KeyReleaseRefusedError(verdict.reason, verdict)
        return verdict

    def _record(
        self,
        partition: str,
        request: ReleaseRequest,
        decision: str,
        reason: str,
        verdict: Verdict | None,
    ) -> None:
        detail: dict[str, object] = {"sandbox": request.sandbox_id, "evidence": request.kind}
        if verdict is not None:
            detail.update(measurement=verdict.measurement, chip=verdict.chip, tcb=verdict.status)
        if reason:
            detail["reason"] = reason
        self.audit.append("key_release", partition=partition, decision=decision, detail=detail)
