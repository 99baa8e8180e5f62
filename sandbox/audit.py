"""The audit log: append-only JSON lines, hash-chained (SHA-256 or SM3) and signed (Ed25519).

Each record holds its sequence number, time, kind, principal, partition, decision and a detail
mapping (never secrets or raw sensitive content), the previous record's hash, its own hash
(over the canonical JSON of everything before it) and a signature of that hash. Lines are
canonical JSON (sorted keys, one spelling): a line in another spelling, with a duplicate key or
with a signature that is not strict base64 is refused, so every reader sees the same record.

Checkpoints vouch for the tail. A signed checkpoint (its own sequence number, the record count,
the chain head, the time, and whether the writer closed the log) is written atomically to
``<log>.checkpoint`` when the log is opened, every ``checkpoint_every`` records, every
``checkpoint_interval_s`` seconds (a heartbeat, also when nothing was appended) and on
:meth:`AuditLog.close`. When the policy names an anchor (``file:PATH``, a store the writer may
only append to), every checkpoint that vouches for new records is appended there too, so an
older checkpoint put back beside the log, or a log and checkpoint rolled back together, no
longer match it. :func:`verify` reports the first broken record, and refuses a log whose
checkpoint is missing, or is not final and older than ``max_checkpoint_age_s``, unless the caller
accepts that (the records after such a checkpoint could have been cut). docs/compliance.md says
exactly what is detected under which conditions.

The record format, the signing key and the checkpoint are in :mod:`.audit_format`, the writer
(:class:`AuditLog`, :func:`append_record`) in :mod:`.audit_writer`, verification in
:mod:`.audit_verify`; every name is imported from here.
"""

from __future__ import annotations

from hetero.sandbox.audit_format import (
    CHECKPOINT_KIND,
    GENESIS,
    HASHES,
    AuditError,
    Checkpoint,
    load_or_create_signing_key,
    parse_anchor,
    public_key_pem,
)
from hetero.sandbox.audit_verify import DEFAULT_MAX_CHECKPOINT_AGE_S, VerifyReport, verify
from hetero.sandbox.audit_writer import AuditLog, append_record

__all__ = [
    "CHECKPOINT_KIND",
    "DEFAULT_MAX_CHECKPOINT_AGE_S",
    "GENESIS",
    "HASHES",
    "AuditError",
    "AuditLog",
    "Checkpoint",
    "VerifyReport",
    "append_record",
    "load_or_create_signing_key",
    "parse_anchor",
    "public_key_pem",
    "verify",
]
