"""L3: local disk through LMDB, bounded in bytes, per-entry expiry, surviving restarts, safe with
several processes.

LMDB was measured against diskcache on the same 5 KB value in one run (``hetero bench cache``):
a page-cached LMDB read is a memory-mapped B-tree lookup in a read transaction, about a tenth of
diskcache's SQLite query. LMDB has no size bound, expiry or tags, so they are kept here, in the
same write transaction as the entry, in named sub-databases of one environment:

- ``data``: key -> record (expiry as Unix seconds, store sequence, tag length, tag, value);
- ``order``: store sequence (big-endian) -> key, oldest first: when the bytes held exceed the
  bound, the least recently stored entries go (diskcache's ``least-recently-stored``: a read
  writes nothing, so reads stay read-only transactions), and expired entries at the head of the
  order are dropped by the writes that pass them;
- ``content``: content digest -> keys (sorted duplicates), so erasure by content is one range;
  erasure by partition is a range of ``data`` itself (keys start with the partition);
- ``meta``: bytes held and the next sequence number.

An entry past its expiry is a miss when read, and is removed. Commits do not wait for the disk
(``sync=False``; the environment is flushed at most once a second and on close): a crash of the
process loses nothing, a crash of the machine may lose the last second of writes, which for a
cache is a miss.

Failures never reach a request. A read that fails bypasses the tier for ``RETRY_AFTER_S``; a
write that fails (a full disk) bypasses writes only, and reads go on. A directory that cannot be
opened for writing is opened read-only if it holds a store (a read-only file system still
serves its entries); one that cannot be opened at all is tried again after the back-off, on
the next read or write. Erasure ignores the back-off and raises if the store cannot be erased,
so an erasure is never reported done when it was not.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb

from hetero.framework.errors import CacheError

__all__ = ["DiskTier"]

logger = logging.getLogger(__name__)
RETRY_AFTER_S = 30.0
SYNC_EVERY_S = 1.0
CULL_EXPIRED = 8  # expired entries at the head of the order dropped per write, at most
MAP_HEADROOM = 64 * 2**20  # the map must hold the bound plus LMDB's pages and free lists
RECORD = struct.Struct("<dQH")  # expires at (Unix s), store sequence, tag length
HEADER = RECORD.size
_unpack_record = RECORD.unpack_from  # bound once: the read path
_time = time.time
SEQ = struct.Struct(">Q")
COUNT = struct.Struct("<q")
BYTES, NEXT = b"bytes", b"next"


class DiskTier:
    """Bytes by key text on local disk (LMDB).

    Args:
        directory: The store's folder (created if missing).
        max_bytes: Bound on the bytes held (keys and records); the oldest stored entries go
            when a write passes it.
        on_error: Called on every failure (the errors metric).
    """

    name = "disk"

    def __init__(
        self, directory: Path, max_bytes: int, on_error: Callable[[], None] = lambda: None
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.errors = 0
        self.evictions = 0
        self.read_only = False
        self._on_error = on_error
        self._env: Any = None
        self._down_until = 0.0  # reads and writes bypassed until then (0: up)
        self._writes_down_until = 0.0
        self._synced_at = time.monotonic()
        self._open_lock = threading.Lock()
        self._closed = False
        self._open()

    # --- opening and failure ---------------------------------------------------------------

    def _open(self) -> bool:
        """Open (or reopen) the store; False, with the tier bypassed, if it cannot be."""
        with self._open_lock:
            if self._env is not None or self._closed:
                return self._env is not None
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                env = lmdb.open(
                    str(self.directory),
                    map_size=2 * self.max_bytes + MAP_HEADROOM,
                    max_dbs=4,
                    max_readers=1024,
                    sync=False,
                    metasync=False,
                    readahead=False,
                    mode=0o600,  # the files are this process's alone, whatever the umask
                )
                self.read_only = False
            except (lmdb.Error, OSError) as err:
                env = self._open_read_only(err)
                if env is None:
                    return False
            try:
                create = not self.read_only
                self._data = env.open_db(b"data", create=create)
                self._order = env.open_db(b"order", create=create)
                self._content = env.open_db(b"content", create=create, dupsort=True)
                self._meta = env.open_db(b"meta", create=create)
            except lmdb.Error as err:
                env.close()
                self._failed(err)
                return False
            self._env = env
            self._down_until = 0.0
            return True

    def _open_read_only(self, err: Exception) -> Any:
        if (self.directory / "data.mdb").is_file():
            try:
                env = lmdb.open(
                    str(self.directory), readonly=True, lock=False, max_dbs=4, readahead=False
                )
            except (lmdb.Error, OSError):
                pass
            else:
                logger.warning(
                    "disk cache at %s is read-only (%s): serving its entries, storing none",
                    self.directory,
                    err,
                )
                self.read_only = True
                return env
        self._failed(err)
        return None

    @property
    def up(self) -> bool:
        """False for a while after a failure; once the back-off is over, a store that could not
        be opened is opened again."""
        if self._down_until:
            if time.monotonic() < self._down_until:
                return False
            self._down_until = 0.0
        if self._env is None:
            return self._open()
        return True

    def _failed(self, err: Exception) -> None:
        self.errors += 1
        self._on_error()
        if not self._down_until:
            logger.warning(
                "disk cache at %s bypassed for %.0f s: %s", self.directory, RETRY_AFTER_S, err
            )
        self._down_until = time.monotonic() + RETRY_AFTER_S

    def _write_failed(self, err: Exception) -> None:
        self.errors += 1
        self._on_error()
        if not self._writes_down_until:
            logger.warning(
                "disk cache at %s stores nothing for %.0f s (reads go on): %s",
                self.directory,
                RETRY_AFTER_S,
                err,
            )
        self._writes_down_until = time.monotonic() + RETRY_AFTER_S

    # --- reads -----------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The stored bytes, or None (missing, expired, or the disk failing)."""
        env = self._env
        if env is None or self._down_until:
            if not self.up:
                return None
            env = self._env
        try:
            # No context manager, and a buffer into the map: the value is copied out once
            # (the record's header and tag never are), and the read transaction ends at once.
            # Module-level bound functions and memoryview.tobytes: 0.1-0.2 us off a 1 us read
            # (thread CPU time, beside a raw LMDB read). begin's arguments by position (db,
            # parent, write, buffers): py-lmdb parses keywords slowly, 0.1 us of the read.
            txn = env.begin(self._data, None, False, True)
            record = txn.get(key.encode())
            if record is None:
                txn.abort()
                return None
            expires_at, _, tag_length = _unpack_record(record)
            value = record[HEADER + tag_length :].tobytes() if expires_at > _time() else None
            txn.abort()
        except lmdb.Error as err:  # a broken disk is a miss
            self._failed(err)
            return None
        if value is None:
            self.delete(key)
        return value

    def read(self, key: str) -> tuple[bytes, int] | None:
        """The stored record and where its value starts in it, or None (as :meth:`get`): the
        record is copied out of the map once, by LMDB's own ``bytes`` (``buffers=False``),
        inside the read transaction, and the value is left in place for
        :func:`hetero.cache.codec.decode_from`. :meth:`get` slices the value out of a buffer
        into the map instead, which is one copy too but costs a buffer object, a slice and a
        ``tobytes`` call (0.2 us of a 5 KB read, docs/runs/cache.md)."""
        env = self._env
        if env is None or self._down_until:
            if not self.up:
                return None
            env = self._env
        try:
            txn = env.begin(self._data, None, False, False)  # db, parent, write, buffers
            record = txn.get(key.encode())
            txn.abort()
        except lmdb.Error as err:  # a broken disk is a miss
            self._failed(err)
            return None
        if record is None:
            return None
        expires_at, _, tag_length = _unpack_record(record)
        if expires_at > _time():
            return record, HEADER + tag_length
        self.delete(key)
        return None

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """The stored bytes of several keys, in order, in one read transaction."""
        found: list[bytes | None] = [None] * len(keys)
        if not self.up:
            return found
        expired = []
        try:
            with self._env.begin(db=self._data, buffers=True) as txn:
                now = time.time()
                for index, key in enumerate(keys):
                    record = txn.get(key.encode())
                    if record is None:
                        continue
                    expires_at, _, tag_length = RECORD.unpack_from(record)
                    if expires_at > now:
                        found[index] = bytes(record[HEADER + tag_length :])
                    else:
                        expired.append(key)
        except lmdb.Error as err:
            self._failed(err)
            return [None] * len(keys)
        for key in expired:
            self.delete(key)
        return found

    # --- writes ----------------------------------------------------------------------------

    def _writable(self) -> Any:
        if self.read_only:
            return None
        if self._writes_down_until:
            if time.monotonic() < self._writes_down_until:
                return None
            self._writes_down_until = 0.0
        return self._env if self.up else None

    def put(self, key: str, blob: bytes, ttl_s: float, tag: str) -> None:
        """Store with an expiry, tagged (with the content digest) for erasure; the oldest stored
        entries go while the bytes held pass the bound. Failures bypass writes."""
        env = self._writable()
        if env is None:
            return
        raw, raw_tag = key.encode(), tag.encode()
        expires_at = time.time() + ttl_s
        try:
            try:
                self._store(env, raw, raw_tag, blob, expires_at)
            except lmdb.MapFullError:  # pages not yet reused: make room, once
                with env.begin(write=True) as txn:
                    self._evict(txn, self._bytes(txn), self.max_bytes // 2)
                self._store(env, raw, raw_tag, blob, expires_at)
        except (lmdb.Error, OSError) as err:
            self._write_failed(err)
            return
        now = time.monotonic()
        if now - self._synced_at >= SYNC_EVERY_S:
            self._synced_at = now
            try:
                env.sync(True)
            except lmdb.Error as err:
                self._write_failed(err)

    def _store(self, env: Any, raw: bytes, tag: bytes, blob: bytes, expires_at: float) -> None:
        with env.begin(write=True) as txn:
            held = self._bytes(txn)
            old = txn.get(raw, db=self._data)
            if old is not None:
                held -= self._unlink(txn, raw, old)
            seq_bytes = txn.get(NEXT, db=self._meta)
            seq = COUNT.unpack(seq_bytes)[0] if seq_bytes is not None else 0
            record = RECORD.pack(expires_at, seq, len(tag)) + tag + blob
            txn.put(raw, record, db=self._data)
            txn.put(SEQ.pack(seq), raw, db=self._order)
            txn.put(tag, raw, db=self._content)
            txn.put(NEXT, COUNT.pack(seq + 1), db=self._meta)
            held += len(raw) + len(record)
            held = self._evict(txn, held, self.max_bytes)
            txn.put(BYTES, COUNT.pack(held), db=self._meta)

    def _bytes(self, txn: Any) -> int:
        held = txn.get(BYTES, db=self._meta)
        return COUNT.unpack(held)[0] if held is not None else 0

    def _evict(self, txn: Any, held: int, bound: int) -> int:
        """Drop the oldest stored entries while ``held`` passes ``bound``, and expired ones at
        the head of the order (a few per write); the bytes held after."""
        now = time.time()
        culled = 0
        cursor = txn.cursor(db=self._order)
        while cursor.first():
            raw = cursor.value()
            record = txn.get(raw, db=self._data)
            if record is None:  # an order entry without its record: drop it
                cursor.delete()
                continue
            if held <= bound:
                if culled >= CULL_EXPIRED or RECORD.unpack_from(record)[0] > now:
                    break
                culled += 1
            else:
                self.evictions += 1
            held -= self._unlink(txn, raw, record)
        txn.put(BYTES, COUNT.pack(held), db=self._meta)
        return held

    def _unlink(self, txn: Any, raw: bytes, record: bytes) -> int:
        """Remove one entry and its index entries; the bytes it held."""
        _, seq, tag_length = RECORD.unpack_from(record)
        tag = bytes(record[RECORD.size : HEADER + tag_length])
        txn.delete(raw, db=self._data)
        txn.delete(SEQ.pack(seq), db=self._order)
        txn.delete(tag, raw, db=self._content)
        return len(raw) + len(record)

    def _remove(self, env: Any, raws: list[bytes]) -> int:
        """Remove entries by key in one transaction; how many were there."""
        removed = 0
        with env.begin(write=True) as txn:
            held = self._bytes(txn)
            for raw in raws:
                record = txn.get(raw, db=self._data)
                if record is not None:
                    held -= self._unlink(txn, raw, record)
                    removed += 1
            txn.put(BYTES, COUNT.pack(max(held, 0)), db=self._meta)
        return removed

    def delete(self, key: str) -> None:
        """Drop one entry (an expired or corrupt one, say)."""
        env = self._writable()
        if env is None:
            return
        try:
            self._remove(env, [key.encode()])
        except (lmdb.Error, OSError) as err:
            self._write_failed(err)

    # --- erasure ---------------------------------------------------------------------------

    def _for_erasure(self) -> Any:
        """The store, opened now whatever the back-off; None if there is no store here.
        Raises if there is one that cannot be erased."""
        if self._env is None and not (self.directory / "data.mdb").exists():
            return None
        if self._env is None and not self._open():
            raise CacheError(f"disk cache at {self.directory} cannot be opened to erase")
        if self.read_only:
            raise CacheError(f"disk cache at {self.directory} is read-only: cannot erase")
        return self._env

    def erase_content(self, content: str) -> int:
        """Drop every entry derived from ``content``; how many. Raises :class:`CacheError` if
        the disk fails: an erasure must not be reported done when it was not."""
        env = self._for_erasure()
        if env is None:
            return 0
        tag = content.encode()
        try:
            with env.begin(db=self._content) as txn:
                cursor = txn.cursor()
                raws = list(cursor.iternext_dup()) if cursor.set_key(tag) else []
            return self._remove(env, raws)
        except (lmdb.Error, OSError) as err:
            raise self._erasure_failed(f"content {content}", err) from err

    def erase_prefix(self, prefix: str) -> int:
        """Drop every entry whose key starts with ``prefix`` (a partition); raises
        :class:`CacheError` on failure."""
        env = self._for_erasure()
        if env is None:
            return 0
        start = prefix.encode()
        raws = []
        try:
            with env.begin(db=self._data) as txn:
                cursor = txn.cursor()
                if cursor.set_range(start):
                    for raw in cursor.iternext(keys=True, values=False):
                        if not raw.startswith(start):
                            break
                        raws.append(raw)
            return self._remove(env, raws)
        except (lmdb.Error, OSError) as err:
            raise self._erasure_failed(f"entries under {prefix}", err) from err

    def _erasure_failed(self, what: str, err: Exception) -> CacheError:
        """The failure counted, and the error a caller of an erasure sees (the store's own
        message kept, never LMDB's exception type)."""
        self.errors += 1
        self._on_error()
        return CacheError(f"disk cache at {self.directory}: erasing {what} failed: {err}")

    # --- the rest --------------------------------------------------------------------------

    def keys(self) -> list[str]:
        """Every key (to warm the Bloom filter at start-up)."""
        if not self.up:
            return []
        try:
            with self._env.begin(db=self._data) as txn:
                return [raw.decode() for raw in txn.cursor().iternext(keys=True, values=False)]
        except lmdb.Error as err:
            self._failed(err)
            return []

    @property
    def size_bytes(self) -> int:
        """Bytes held (keys and records)."""
        env = self._env
        if env is None:
            return 0
        try:
            with env.begin() as txn:
                return self._bytes(txn)
        except lmdb.Error:
            return 0

    def close(self) -> None:
        """Flush and close the store."""
        with self._open_lock:
            self._closed = True
            env, self._env = self._env, None
            if env is not None:
                if not self.read_only:
                    try:
                        env.sync(True)
                    except lmdb.Error as err:
                        logger.warning(
                            "disk cache at %s: last flush failed: %s", self.directory, err
                        )
                env.close()
