"""Verifying an audit log: every record's form, chain link, hash and signature, then the
anchor and the checkpoint (:func:`verify`, :class:`VerifyReport`); the walk over the records
is shared with the writer (:mod:`.audit_writer`), which adopts other processes' records."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from hetero.sandbox.audit_format import (
    GENESIS,
    AuditError,
    Checkpoint,
    _canonical,
    _checkpoint_path,
    _digest,
    _lines,
    _parse_line,
    _read_checkpoint,
    _strict_b64,
)

__all__ = ["DEFAULT_MAX_CHECKPOINT_AGE_S", "VerifyReport", "verify"]

DEFAULT_MAX_CHECKPOINT_AGE_S = 60.0


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify` found.

    Attributes:
        ok: Intact, with every check the caller did not waive.
        records: Records read before the first problem (all of them when ``ok``).
        head: The hash of the last good record.
        problem: The first problem, naming the line where there is one.
        line: That line's number.
        warning: What was waived (a missing or stale checkpoint), when ``ok``.
        vouched: How many records the checkpoint vouches for; the rest are unvouched.
        checkpoint_seq: The checkpoint's number (-1 without one).
        anchor_seq: The newest anchored checkpoint's number (-1 without an anchor).
    """

    ok: bool
    records: int
    head: str
    problem: str = ""
    line: int | None = None
    warning: str = ""
    vouched: int = 0
    checkpoint_seq: int = -1
    anchor_seq: int = -1


def _read_anchor(anchor: Path, public_key: Ed25519PublicKey) -> list[Checkpoint]:
    try:
        lines = _lines(anchor)
    except FileNotFoundError:
        raise AuditError(f"{anchor}: audit anchor not found") from None
    entries: list[Checkpoint] = []
    for number, line in enumerate(lines, start=1):
        try:
            entry = _read_checkpoint(line, public_key)
        except (ValueError, KeyError, TypeError) as err:
            raise AuditError(f"{anchor}: line {number}: unreadable or forged ({err})") from None
        if entries and (entry.seq <= entries[-1].seq or entry.records < entries[-1].records):
            raise AuditError(f"{anchor}: line {number}: goes back (rewritten anchor)")
        entries.append(entry)
    return entries


@dataclass(slots=True)
class _Walk:
    """What reading the records found: how many are intact, the last one's hash and time,
    the hashes the anchor asks about, and the first problem."""

    count: int = 0
    head: str = GENESIS
    last_time: float = 0.0
    hashes_at: dict[int, str] = field(default_factory=dict)
    problem: str = ""
    line: int | None = None


def _walk(
    lines: list[str], public_key: Ed25519PublicKey, wanted: set[int], start: _Walk | None = None
) -> _Walk:
    walk = start or _Walk()
    for number, line in enumerate(lines, start=1):
        try:
            record = _parse_line(line)
            claimed, signature = record.pop("hash"), _strict_b64(record.pop("sig"))
            recomputed = _digest(record["alg"], _canonical(record))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            problem = f"unreadable record ({err})"
        else:
            problem = _record_problem(record, walk, claimed, recomputed, signature, public_key)
        if problem:
            walk.problem, walk.line = f"line {number}: {problem}", number
            return walk
        if walk.count in wanted:
            walk.hashes_at[walk.count] = claimed
        stamp = record.get("time")
        walk.last_time = float(stamp) if isinstance(stamp, int | float) else 0.0
        walk.head, walk.count = claimed, walk.count + 1
    return walk


def _record_problem(
    record: dict[str, Any],
    walk: _Walk,
    claimed: str,
    recomputed: str,
    signature: bytes,
    public_key: Ed25519PublicKey,
) -> str:
    if record.get("seq") != walk.count:
        due = f"sequence {record.get('seq')} where {walk.count} was due"
        return f"{due} (a record was removed or reordered)"
    if record.get("prev") != walk.head:
        return "does not chain to the previous record"
    if recomputed != claimed:
        return "content does not match its hash (edited)"
    try:
        public_key.verify(signature, bytes.fromhex(claimed))
    except InvalidSignature:
        return "bad signature"
    return ""


def _anchor_problem(walk: _Walk, anchored: list[Checkpoint]) -> str:
    for entry in anchored:
        if walk.count < entry.records:
            return (
                f"the log ends at {walk.count} records, its anchor vouches for {entry.records} "
                f"(checkpoint {entry.seq}): records were cut"
            )
        if entry.records and walk.hashes_at.get(entry.records - 1) != entry.head:
            return (
                f"record {entry.records - 1} is not the one the anchor vouches for "
                f"(checkpoint {entry.seq}): the log was rewritten"
            )
    return ""


def _checkpoint_problem(walk: _Walk, checkpoint: Checkpoint, lines: list[str]) -> str:
    if walk.count < checkpoint.records:
        return (
            f"the log ends at {walk.count} records, its checkpoint vouches for {checkpoint.records}"
        )
    if checkpoint.records and _hash_at(lines, checkpoint.records - 1) != checkpoint.head:
        last = walk.count == checkpoint.records
        where = "the last record" if last else f"record {checkpoint.records - 1}"
        return f"{where} is not the one the checkpoint vouches for"
    if not checkpoint.records and checkpoint.head != GENESIS:
        return "the checkpoint vouches for no records but names a head"
    return ""


def _staleness(walk: _Walk, checkpoint: Checkpoint, max_age_s: float, now: float) -> str:
    """Why the records after a checkpoint that is not final are not vouched for ("" when the
    checkpoint is recent: a live writer rewrites it every interval)."""
    stamp = checkpoint.time
    if stamp is None:
        return "the checkpoint has no time (written by an older version)"
    if now - stamp > max_age_s:
        return (
            f"the checkpoint is {now - stamp:.0f} s old and not final (policy allows "
            f"{max_age_s:g} s): the writer stopped without closing the log, or an older "
            "checkpoint was put back"
        )
    if walk.count > checkpoint.records and walk.last_time - stamp > max_age_s:
        return (
            f"record {walk.count - 1} was written {walk.last_time - stamp:.0f} s after the "
            f"checkpoint (policy allows {max_age_s:g} s): an older checkpoint was put back"
        )
    return ""


def verify(
    path: Path,
    public_key: Ed25519PublicKey,
    *,
    anchor: Path | None = None,
    max_checkpoint_age_s: float = DEFAULT_MAX_CHECKPOINT_AGE_S,
    allow_missing_checkpoint: bool = False,
    allow_stale_checkpoint: bool = False,
    now: float | None = None,
) -> VerifyReport:
    """Check every record's form, chain link, hash and signature, then the anchor and the
    checkpoint.

    Args:
        path: The log.
        public_key: The writer's key.
        anchor: The anchor file the writer appends checkpoints to, if the policy names one.
        max_checkpoint_age_s: How old a checkpoint that is not final may be (a running writer
            rewrites it every ``checkpoint_interval_s``), and how far after it an unvouched
            record may lie.
        allow_missing_checkpoint: Accept a log without its checkpoint (reported as a warning).
        allow_stale_checkpoint: Accept a checkpoint that is not final and too old (a writer
            that crashed); the records after it are then not vouched for.
        now: The time to judge age against (the clock by default).
    """
    try:
        lines = _lines(path)
    except FileNotFoundError as err:
        raise AuditError(f"{path}: audit log not found") from err
    anchored = [] if anchor is None else _read_anchor(anchor, public_key)
    anchor_seq = anchored[-1].seq if anchored else -1
    walk = _walk(lines, public_key, {entry.records - 1 for entry in anchored})
    facts: dict[str, Any] = {"anchor_seq": anchor_seq}

    def report(problem: str = "", warning: str = "") -> VerifyReport:
        return VerifyReport(
            not problem, walk.count, walk.head, problem, walk.line, warning, **facts
        )

    if walk.problem:
        return report(walk.problem)
    problem = _anchor_problem(walk, anchored)
    if problem:
        return report(problem)
    checkpoint_path = _checkpoint_path(path)
    try:
        text = checkpoint_path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        facts["vouched"] = anchored[-1].records if anchored else 0
        missing = f"no checkpoint ({checkpoint_path.name}): records could have been cut"
        if anchored:
            missing += f" after the anchored {anchored[-1].records}"
        if allow_missing_checkpoint:
            return report(warning=missing)
        return report(missing + " (--allow-missing-checkpoint accepts that)")
    try:
        checkpoint = _read_checkpoint(text.rstrip("\n"), public_key)
    except (ValueError, KeyError, TypeError) as err:
        return report(f"checkpoint: unreadable or forged ({err})")
    facts.update(checkpoint_seq=checkpoint.seq, vouched=checkpoint.records)
    if anchored and checkpoint.seq < anchor_seq:
        return report(
            f"the checkpoint ({checkpoint.seq}) is older than the anchor's newest "
            f"({anchor_seq}): an older checkpoint was put back"
        )
    anchored_records = anchored[-1].records if anchored else 0
    if anchor is not None and checkpoint.records > anchored_records:
        # the writer appends every checkpoint that vouches for new records to the anchor
        return report(
            f"the anchor is behind the log's checkpoint (the checkpoint vouches for "
            f"{checkpoint.records} records, the anchor for {anchored_records}): the anchor "
            "was emptied or rolled back"
        )
    problem = _checkpoint_problem(walk, checkpoint, lines)
    if problem:
        return report(problem)
    if checkpoint.final and walk.count == checkpoint.records:
        return report()
    # Not final, or records follow a final checkpoint: the tail after it is vouched for only
    # while the checkpoint is recent.
    stale = _staleness(walk, checkpoint, max_checkpoint_age_s, time.time() if now is None else now)
    if not stale:
        return report()
    unvouched = walk.count - checkpoint.records
    if unvouched:
        stale += f"; {unvouched} records after it are not vouched for"
    if allow_stale_checkpoint:
        return report(warning=stale)
    return report(stale + " (--allow-stale-checkpoint accepts that)")


def _hash_at(lines: list[str], index: int) -> str:
    """The hash of record ``index`` of lines :func:`verify` has already checked."""
    value = json.loads(lines[index])
    return str(value["hash"])
