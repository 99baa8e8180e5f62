"""Writing the audit log: :class:`AuditLog` (the one writer per file: signed, chained records,
checkpoints on open, on an interval and on close, the anchor) and :func:`append_record` (a
one-off record from another process, adopted by a live writer under the file lock)."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hetero.sandbox.audit_format import (
    GENESIS,
    HASHES,
    AuditError,
    Checkpoint,
    _canonical,
    _checkpoint_path,
    _digest,
    _line,
)
from hetero.sandbox.audit_verify import _Walk, _walk, verify

__all__ = ["AuditLog", "append_record"]

# the name the log had before it was split: what logging configuration filters on
logger = logging.getLogger("hetero.sandbox.audit")

_FS_IOC_GETFLAGS = 0x80086601
_FS_APPEND_FL = 0x20


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
