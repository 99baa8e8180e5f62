"""The audit log's record format: canonical JSON lines (one spelling, no duplicate keys,
strict base64 signatures), hashing, the signing key, the anchor reference and the signed
checkpoint (:class:`Checkpoint`) that the writer (:mod:`.audit_writer`) writes and
:mod:`.audit_verify` reads."""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hetero.framework.errors import HeteroError

__all__ = [
    "CHECKPOINT_KIND",
    "GENESIS",
    "HASHES",
    "AuditError",
    "Checkpoint",
    "load_or_create_signing_key",
    "parse_anchor",
    "public_key_pem",
]

GENESIS = "0" * 64
HASHES = {"sha256": hashes.SHA256, "sm3": hashes.SM3}
CHECKPOINT_KIND = "hetero-audit-checkpoint"
_SIGNATURE_B64_CHARS = 88  # an Ed25519 signature is 64 bytes


class AuditError(HeteroError, ValueError):
    """The audit file, its checkpoint, its anchor or its key cannot be read."""


def _digest(algorithm: str, data: bytes) -> str:
    hasher = hashes.Hash(HASHES[algorithm]())
    hasher.update(data)
    return hasher.finalize().hex()


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _line(record: dict[str, Any]) -> str:
    """How a record or checkpoint is written: the one spelling :func:`_parse_line` accepts."""
    return json.dumps(record, sort_keys=True, ensure_ascii=False)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        duplicated = sorted({key for key in keys if keys.count(key) > 1})
        raise ValueError(f"duplicate key {', '.join(map(repr, duplicated))}")
    return dict(pairs)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_line(line: str, *, canonical: bool = True) -> dict[str, Any]:
    """One record or checkpoint: an object with no duplicate keys, in canonical spelling."""
    value = json.loads(line, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    if canonical and _line(value) != line:
        raise ValueError("not in canonical form (sorted keys, one spelling)")
    return value


def _strict_b64(text: Any) -> bytes:
    """A signature: exactly 88 base64 characters with padding and nothing else."""
    if not isinstance(text, str) or len(text) != _SIGNATURE_B64_CHARS:
        raise ValueError("signature is not 88 base64 characters")
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error as err:
        raise ValueError(f"signature is not strict base64 ({err})") from None
    if base64.b64encode(raw).decode() != text:
        raise ValueError("signature is not in canonical base64")
    return raw


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


def parse_anchor(reference: str | None) -> Path | None:
    """The anchor file a policy's ``audit.anchor`` names (``file:PATH``), or None."""
    if not reference:
        return None
    scheme, _, rest = reference.partition(":")
    if scheme != "file" or not rest:
        raise AuditError(f"audit anchor {reference!r}: expected file:<path>")
    return Path(rest).expanduser()


def _lines(path: Path) -> list[str]:
    """The lines of a log or anchor: split at ``\\n`` and nowhere else, the one separator the
    writer puts between records (``str.splitlines`` also splits at U+2028, U+2029, U+0085,
    which a record may hold inside a string, and at ``\\r``, which no record ends with)."""
    text = path.read_bytes().decode("utf-8")  # not read_text: it turns \r\n into \n
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    return lines


def _checkpoint_path(log: Path) -> Path:
    return log.with_name(log.name + ".checkpoint")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A signed statement by the log's writer: the first ``records`` records end in ``head``.

    Attributes:
        seq: Counts checkpoints across the log's life; a later one has a higher number.
        time: When it was written (Unix seconds); None for the first format, which had none.
        final: Written by :meth:`AuditLog.close`: nothing followed, as far as the writer knew.
    """

    seq: int
    records: int
    head: str
    time: float | None
    final: bool

    def body(self, algorithm: str) -> dict[str, Any]:
        return {
            "kind": CHECKPOINT_KIND,
            "alg": algorithm,
            "seq": self.seq,
            "records": self.records,
            "head": self.head,
            "time": self.time,
            "final": self.final,
        }


def _read_checkpoint(text: str, public_key: Ed25519PublicKey) -> Checkpoint:
    """A checkpoint line, its signature checked; ValueError when unreadable or forged."""
    value = _parse_line(text, canonical=False)
    if "kind" in value and _line(value) != text:
        raise ValueError("not in canonical form (sorted keys, one spelling)")
    signature = _strict_b64(value.pop("sig", None))
    if "kind" not in value:  # the first format (unsorted keys): records and head, no time
        if set(value) != {"records", "head"}:
            raise ValueError("unknown checkpoint fields")
        body: dict[str, Any] = value
        checkpoint = Checkpoint(0, value["records"], value["head"], None, False)
    else:
        if value.get("kind") != CHECKPOINT_KIND or set(value) != set(
            Checkpoint(0, 0, "", None, False).body("")
        ):
            raise ValueError("not an audit checkpoint")
        body = value
        checkpoint = Checkpoint(
            value["seq"], value["records"], value["head"], value["time"], value["final"]
        )
    if not (
        isinstance(checkpoint.seq, int)
        and isinstance(checkpoint.records, int)
        and isinstance(checkpoint.head, str)
        and isinstance(checkpoint.final, bool)
        and (checkpoint.time is None or isinstance(checkpoint.time, int | float))
    ):
        raise ValueError("checkpoint fields of the wrong type")
    try:
        public_key.verify(signature, _canonical(body))
    except InvalidSignature:
        raise ValueError("bad signature") from None
    return checkpoint
