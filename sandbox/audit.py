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
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import json
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hetero.framework.errors import HeteroError

__all__ = [
    "AuditError",
    "AuditLog",
    "Checkpoint",
    "VerifyReport",
    "append_record",
    "load_or_create_signing_key",
    "parse_anchor",
    "verify",
]

logger = logging.getLogger(__name__)

GENESIS = "0" * 64
HASHES = {"sha256": hashes.SHA256, "sm3": hashes.SM3}
CHECKPOINT_KIND = "hetero-audit-checkpoint"
DEFAULT_MAX_CHECKPOINT_AGE_S = 60.0
_SIGNATURE_B64_CHARS = 88  # an Ed25519 signature is 64 bytes
_FS_IOC_GETFLAGS = 0x80086601
_FS_APPEND_FL = 0x20


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


def _warn_unless_append_only(path: Path) -> None:
    """An anchor the writer can rewrite anchors nothing against the writer: say so once."""
    try:
        with path.open("rb") as handle:
            flags = struct.unpack("l", fcntl.ioctl(handle, _FS_IOC_GETFLAGS, struct.pack("l", 0)))
    except OSError as err:
        logger.warning(
            "audit anchor %s: cannot read its attributes (%s); make sure this process can only "
            "append to it (chattr +a, a WORM mount, or a store on another host)",
            path,
            err.strerror,
        )
        return
    if not flags[0] & _FS_APPEND_FL:
        logger.warning(
            "audit anchor %s is not append-only: whoever runs this process can roll it back "
            "(as root: chattr +a %s)",
            path,
            path,
        )


def _liveness_path(log: Path) -> Path:
    return log.with_name(log.name + ".writer")


def _open_liveness(log: Path) -> int:
    return os.open(_liveness_path(log), os.O_RDWR | os.O_CREAT, 0o600)


@contextlib.contextmanager
def _appending(path: Path) -> Iterator[int]:
    """The log opened for appending, locked against other processes' appends."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield descriptor
    finally:
        os.close(descriptor)  # releases the lock


def _signed_record(
    key: Ed25519PrivateKey,
    algorithm: str,
    seq: int,
    prev: str,
    stamp: float,
    fields: dict[str, Any],
) -> dict[str, Any]:
    record: dict[str, Any] = {"seq": seq, "time": stamp, **fields, "alg": algorithm, "prev": prev}
    record["hash"] = _digest(algorithm, _canonical(record))
    record["sig"] = base64.b64encode(key.sign(bytes.fromhex(record["hash"]))).decode()
    return record


def append_record(
    path: Path,
    key: Ed25519PrivateKey,
    kind: str,
    *,
    principal: str = "",
    partition: str = "",
    decision: str = "",
    detail: dict[str, Any] | None = None,
    algorithm: str = "sha256",
    checkpoint_every: int = 100,
    anchor: Path | None = None,
) -> str:
    """Append one record from a short-lived process (a CLI command) to a log a server may be
    writing; its hash.

    With no live writer (none holds the log's ``.writer`` lock), the log is opened as its
    writer (checked, checkpointed and anchored as always) and closed. With one, every record is
    checked first, the record is appended under the log's lock, and the live writer adopts it
    and vouches for it at its next checkpoint (every ``checkpoint_interval_s``). A server that
    starts in the instant between the lock probe and the opening is not seen (then two writers
    would checkpoint; verify names any break).
    """
    fields = {
        "kind": kind,
        "principal": principal,
        "partition": partition,
        "decision": decision,
        "detail": detail or {},
    }
    probe = _open_liveness(path)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        live = True
    else:
        live = False
    finally:
        os.close(probe)  # releases the probe's lock
    if not live:
        log = AuditLog(
            path,
            key,
            algorithm=algorithm,
            checkpoint_every=checkpoint_every,
            checkpoint_interval_s=None,
            anchor=anchor,
        )
        try:
            return log.append(
                kind,
                principal=principal,
                partition=partition,
                decision=decision,
                detail=detail,
            )
        finally:
            log.close()
    with _appending(path) as descriptor:
        size = os.fstat(descriptor).st_size
        lines = os.pread(descriptor, size, 0).decode("utf-8").split("\n")
        if lines and not lines[-1]:
            lines.pop()
        walk = _walk(lines, key.public_key(), set())
        if walk.problem:
            raise AuditError(f"{path}: refusing to append to a broken log: {walk.problem}")
        record = _signed_record(key, algorithm, walk.count, walk.head, time.time(), fields)
        _write_all(descriptor, (_line(record) + "\n").encode())
    return str(record["hash"])


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]
    os.fsync(descriptor)


class AuditLog:
    """Appends signed, chained records and checkpoints them; one writer per file, and one-off
    records from other processes (:func:`append_record`) adopted under a file lock.

    Call :meth:`close` when the process stops: the final checkpoint says nothing followed.
    """

    def __init__(
        self,
        path: Path,
        key: Ed25519PrivateKey,
        *,
        algorithm: str = "sha256",
        checkpoint_every: int = 100,
        checkpoint_interval_s: float | None = 5.0,
        anchor: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if algorithm not in HASHES:
            raise AuditError(f"unknown audit hash {algorithm!r} (known: {', '.join(HASHES)})")
        self.path = path
        self.key = key
        self.algorithm = algorithm
        self.checkpoint_every = checkpoint_every
        self.anchor = anchor
        self.clock = clock
        self._lock = threading.Lock()
        self._count, self._head, self._seq, self._anchored = 0, GENESIS, 0, -1
        self._closed = False
        # held shared for the writer's life: a one-off writer (append_record) that cannot take
        # it exclusively knows a live writer will vouch for its record
        self._liveness = _open_liveness(path)
        fcntl.flock(self._liveness, fcntl.LOCK_SH)
        created_anchor = anchor is not None and not anchor.exists()
        if anchor is not None and created_anchor:
            if path.exists():
                logger.warning(
                    "audit anchor %s did not exist: created; it vouches for %s from now on",
                    anchor,
                    path,
                )
            descriptor = os.open(anchor, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.close(descriptor)
        existed = path.exists()
        # under the append lock (created 0600 if new): a one-off writer's record waits, so the
        # end taken below is the end of what verify read, and a later record is adopted
        with _appending(path) as descriptor:
            if existed:
                report = verify(
                    path,
                    key.public_key(),
                    # a new anchor vouches for nothing yet: the first checkpoint below goes there
                    anchor=None if created_anchor else anchor,
                    allow_missing_checkpoint=True,
                    allow_stale_checkpoint=True,
                    now=clock(),
                )
                if not report.ok:
                    raise AuditError(
                        f"{path}: refusing to append to a broken log: {report.problem}"
                    )
                if report.warning:
                    logger.warning("audit log %s: %s", path, report.warning)
                self._count, self._head = report.records, report.head
                self._seq = max(report.checkpoint_seq, report.anchor_seq) + 1
            self._end = os.fstat(descriptor).st_size
        if anchor is not None:
            _warn_unless_append_only(anchor)
        with self._lock:
            self._checkpoint(final=False)
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        if checkpoint_interval_s is not None:
            self._heartbeat = threading.Thread(
                target=self._beat,
                args=(checkpoint_interval_s,),
                name=f"audit-checkpoint-{path.name}",
                daemon=True,
            )
            self._heartbeat.start()

    @property
    def records(self) -> int:
        """How many records the log holds."""
        return self._count

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
        with self._lock, _appending(self.path) as descriptor:
            self._catch_up(descriptor)
            record = _signed_record(
                self.key,
                self.algorithm,
                self._count,
                self._head,
                self.clock(),
                {
                    "kind": kind,
                    "principal": principal,
                    "partition": partition,
                    "decision": decision,
                    "detail": detail or {},
                },
            )
            _write_all(descriptor, (_line(record) + "\n").encode())
            self._end = os.fstat(descriptor).st_size
            self._count += 1
            self._head = record["hash"]
            if self._closed or self._count % self.checkpoint_every == 0:
                # after close every record is vouched for at once: nothing else will
                self._checkpoint(final=self._closed)
            return str(record["hash"])

    def checkpoint(self) -> Checkpoint:
        """Write a checkpoint now (the heartbeat calls this every interval); it vouches for
        records other processes appended meanwhile too (:func:`append_record`)."""
        with self._lock:
            with _appending(self.path) as descriptor:
                self._catch_up(descriptor)
            return self._checkpoint(final=self._closed)

    def _catch_up(self, descriptor: int) -> None:
        """Adopt the records another process appended since our last write (checked: chain,
        hash, signature). Records that do not check out are left for :func:`verify` to name:
        this writer keeps appending to its own chain, which then shows the break."""
        size = os.fstat(descriptor).st_size
        if size <= self._end:
            self._end = size  # a cut shows as a sequence gap at the next verify
            return
        tail = os.pread(descriptor, size - self._end, self._end).decode("utf-8", "replace")
        lines = tail.split("\n")
        if lines and not lines[-1]:
            lines.pop()
        start = _Walk(count=self._count, head=self._head)
        walk = _walk(lines, self.key.public_key(), set(), start)
        if walk.problem:
            logger.warning(
                "audit log %s: a record another process appended: %s", self.path, walk.problem
            )
        self._count, self._head, self._end = walk.count, walk.head, size

    def _checkpoint(self, *, final: bool) -> Checkpoint:
        checkpoint = Checkpoint(self._seq, self._count, self._head, self.clock(), final)
        body = checkpoint.body(self.algorithm)
        text = _line({**body, "sig": base64.b64encode(self.key.sign(_canonical(body))).decode()})
        target = _checkpoint_path(self.path)
        temporary = target.with_name(target.name + ".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        temporary.replace(target)
        if self.anchor is not None and (self._count != self._anchored or final):
            descriptor = os.open(self.anchor, os.O_WRONLY | os.O_APPEND)
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            self._anchored = self._count
        self._seq += 1
        return checkpoint

    def _beat(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.checkpoint()
            except OSError as err:  # logged, and tried again next interval
                logger.warning("audit log %s: checkpoint failed: %s", self.path, err)

    def close(self) -> None:
        """Stop the heartbeat and write the final checkpoint. Records appended afterwards
        (a sandbox stopping late) are each checkpointed at once. Idempotent."""
        self._stop.set()
        heartbeat = self._heartbeat
        if heartbeat is not None and heartbeat is not threading.current_thread():
            heartbeat.join()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with _appending(self.path) as descriptor:
                self._catch_up(descriptor)
            self._checkpoint(final=True)
            fcntl.flock(self._liveness, fcntl.LOCK_UN)
            os.close(self._liveness)


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
