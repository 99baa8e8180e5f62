"""The audit record of a data subject's erasure (``hetero sandbox erase``).

The record names the partition, the operator, the erased objects' ids (opaque: a uuid or a
keyed digest, never the subject or the content) and how many derived cache entries went; it is
appended to the policy's audit log whether or not a server is writing it
(:func:`hetero.sandbox.audit.append_record`).
"""

from __future__ import annotations

import getpass
from collections.abc import Sequence
from pathlib import Path

from hetero.framework.policy import Policy
from hetero.sandbox.audit import append_record, load_or_create_signing_key, parse_anchor

__all__ = ["audit_erasure"]


def audit_erasure(
    policy: Policy, partition: str, objects: Sequence[str], cache_entries: int
) -> str:
    """Append an ``erasure`` record to ``policy``'s audit log; the record's hash."""
    audit = policy.spec.audit
    path = Path(audit.path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_path = Path(audit.signing_key).expanduser()
    key_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        operator = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        operator = "unknown"
    return append_record(
        path,
        load_or_create_signing_key(key_path),
        "erasure",
        principal=f"operator:{operator}",
        partition=partition,
        decision="erased",
        detail={
            "objects": sorted(objects),
            "count": len(objects),
            "cache_entries": cache_entries,
        },
        algorithm=audit.hash,
        checkpoint_every=audit.checkpoint_every,
        anchor=parse_anchor(audit.anchor),
    )
