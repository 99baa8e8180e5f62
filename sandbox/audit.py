"""The audit log: append-only JSON lines, hash-chained (SHA-256 or SM3) and signed (Ed25519).

Each record holds its sequence number, time, kind, principal, partition, decision and a detail
mapping (never secrets or raw sensitive content), the previous record's hash, its own hash
(over the canonical JSON of everything before it) and a signature of that hash. Every
``checkpoint_every`` records, and on close, a signed checkpoint (count and head hash) is
written atomically to ``<log>.checkpoint`` beside the log: cutting records off the tail then
shows too, since the log no longer reaches the checkpoint. :func:`verify` reports the first
broken record.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hetero.framework.errors import HeteroError

__all__ = ["AuditError", "AuditLog", "VerifyReport", "load_or_create_signing_key", "verify"]

GENESIS = "0" * 64
HASHES = {"sha256": hashes.SHA256, "sm3": hashes.SM3}


class AuditError(HeteroError, ValueError):
    """The audit file or its key cannot be read."""


def _digest(algorithm: str, data: bytes) -> str:
    hasher = hashes.Hash(HASHES[algorithm]())
    hasher.update(data)
    return hasher.finalize().hex()


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def load_or_create_signing_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 key in ``path`` (PEM, 0600), created on first use."""
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise AuditError(f"{path}: not an Ed25519 private key")
        return key
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
    return key


def public_key_pem(key: Ed25519PrivateKey) -> bytes:
    """The public half, PEM, for verifiers."""
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


class AuditLog:
    """Appends signed, chained records; one writer per file."""

    def __init__(
        self,
        path: Path,
        key: Ed25519PrivateKey,
        *,
        algorithm: str = "sha256",
        checkpoint_every: int = 100,
    ) -> None:
        if algorithm not in HASHES:
            raise AuditError(f"unknown audit hash {algorithm!r} (known: {', '.join(HASHES)})")
        self.path = path
        self.key = key
        self.algorithm = algorithm
        self.checkpoint_every = checkpoint_every
        self._lock = threading.Lock()
        self._count, self._head = 0, GENESIS
        if path.exists():
            report = verify(path, key.public_key())
            if not report.ok:
                raise AuditError(f"{path}: refusing to append to a broken log: {report.problem}")
            self._count, self._head = report.records, report.head

    def append(
        self,
        kind: str,
        *,
        principal: str = "",
        partition: str = "",
        decision: str = "",
        detail: dict[str, Any] | None = None,
    ) -> str:
        """Write one record; returns its hash."""
        with self._lock:
            record: dict[str, Any] = {
                "seq": self._count,
                "time": time.time(),
                "kind": kind,
                "principal": principal,
                "partition": partition,
                "decision": decision,
                "detail": detail or {},
                "alg": self.algorithm,
                "prev": self._head,
            }
            record["hash"] = _digest(self.algorithm, _canonical(record))
            record["sig"] = base64.b64encode(self.key.sign(bytes.fromhex(record["hash"]))).decode()
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            self._count += 1
            self._head = record["hash"]
            if self._count % self.checkpoint_every == 0:
                self._checkpoint()
            return str(record["hash"])

    def _checkpoint(self) -> None:
        body = {"records": self._count, "head": self._head}
        signed = {**body, "sig": base64.b64encode(self.key.sign(_canonical(body))).decode()}
        temporary = self.path.with_name(self.path.name + ".checkpoint.tmp")
        temporary.write_text(json.dumps(signed), encoding="utf-8")
        temporary.replace(self.path.with_name(self.path.name + ".checkpoint"))

    def close(self) -> None:
        """Write a final checkpoint."""
        with self._lock:
            self._checkpoint()


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify` found."""

    ok: bool
    records: int
    head: str
    problem: str = ""
    line: int | None = None


def verify(path: Path, public_key: Ed25519PublicKey) -> VerifyReport:
    """Check every record's chain link, hash and signature, and the checkpoint."""
    previous, count = GENESIS, 0

    def broken(problem: str, line: int | None = None) -> VerifyReport:
        return VerifyReport(False, count, previous, problem, line)

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as err:
        raise AuditError(f"{path}: audit log not found") from err
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
            claimed, signature = record.pop("hash"), base64.b64decode(record.pop("sig"))
            recomputed = _digest(record["alg"], _canonical(record))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            return broken(f"line {number}: unreadable record ({err})", number)
        if record.get("seq") != count:
            due = f"sequence {record.get('seq')} where {count} was due"
            return broken(f"line {number}: {due} (a record was removed or reordered)", number)
        if record.get("prev") != previous:
            return broken(f"line {number}: does not chain to the previous record", number)
        if recomputed != claimed:
            return broken(f"line {number}: content does not match its hash (edited)", number)
        try:
            public_key.verify(signature, bytes.fromhex(claimed))
        except InvalidSignature:
            return broken(f"line {number}: bad signature", number)
        previous, count = claimed, count + 1
    checkpoint_path = path.with_name(path.name + ".checkpoint")
    if checkpoint_path.exists():
        try:
            checkpoint = json.loads(checkpoint_path.read_text(encoding="utf-8"))
            body = {"records": checkpoint["records"], "head": checkpoint["head"]}
            public_key.verify(base64.b64decode(checkpoint["sig"]), _canonical(body))
        except (ValueError, KeyError, TypeError, InvalidSignature) as err:
            return broken(f"checkpoint: unreadable or forged ({err})")
        if count < body["records"]:
            vouched = body["records"]
            return broken(f"the log ends at {count} records, its checkpoint vouches for {vouched}")
        if count == body["records"] and previous != body["head"]:
            return broken("the last record is not the one the checkpoint vouches for")
    return VerifyReport(True, count, previous)
