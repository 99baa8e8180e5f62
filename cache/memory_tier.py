"""L1: in-process memory, bounded in bytes, LRU eviction with TinyLFU admission.

Multimodal traffic is skewed with a long tail of one-off content (a new photo, a stranger's
voice): plain LRU lets every one-off push out an entry that is asked for again and again.
TinyLFU (Einziger, Friedman and Manes, 2017) keeps a small count-min sketch of recent request
frequencies (hits, and misses when their value is offered) and admits a new entry only if it has
been asked for more often than the entry it would evict. The sketch halves its counters every
``10 x capacity`` requests, so frequencies track the recent past. A value's size is its encoded
length.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FrequencySketch", "MemoryTier"]

ROWS = 4


class FrequencySketch:
    """A count-min sketch of small counters (capped at 15), halved periodically."""

    def __init__(self, width: int, reset_after: int) -> None:
        self.width = max(64, width)
        self._rows = [bytearray(self.width) for _ in range(ROWS)]
        self._reset_after = max(reset_after, 1)
        self._seen = 0

    def add(self, digest: bytes) -> None:
        """Count one request for ``digest`` (the digest's bytes are the row hashes)."""
        width = self.width
        for row_index, row in enumerate(self._rows):
            slot = int.from_bytes(digest[4 * row_index : 4 * row_index + 4], "little") % width
            if row[slot] < 15:
                row[slot] += 1
        self._seen += 1
        if self._seen >= self._reset_after:
            for index, row in enumerate(self._rows):
                self._rows[index] = bytearray((np.frombuffer(row, np.uint8) >> 1).tobytes())
            self._seen //= 2

    def estimate(self, digest: bytes) -> int:
        """How often ``digest`` was asked for recently (an upper bound)."""
        width = self.width
        return min(
            row[int.from_bytes(digest[4 * i : 4 * i + 4], "little") % width]
            for i, row in enumerate(self._rows)
        )


@dataclass(slots=True)
class _Entry:
    value: Any
    size: int
    expires_at: float


class MemoryTier:
    """A byte-bounded map from key digests to decoded values."""

    name = "memory"

    def __init__(
        self, max_bytes: int, *, expected_entries: int = 10_000, admission: bool = True
    ) -> None:
        self.max_bytes = max_bytes
        self.admission = admission
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._bytes = 0
        self._sketch = FrequencySketch(
            width=2 * expected_entries, reset_after=10 * expected_entries
        )
        self._lock = threading.Lock()
        self.evictions = 0
        self.rejections = 0

    @property
    def size_bytes(self) -> int:
        """Bytes held."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, digest: bytes, now: float) -> Any | None:
        """The value, or None (missing or expired). A hit counts towards the key's frequency
        here; a miss counts when the computed value is offered to :meth:`put`, so a miss on
        never-seen content stays one dictionary lookup."""
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            if entry.expires_at <= now:
                self._remove(digest)
                return None
            self._sketch.add(digest)
            self._entries.move_to_end(digest)
            return entry.value

    def put(self, digest: bytes, value: Any, size: int, expires_at: float) -> bool:
        """Store unless admission refuses it; True if stored."""
        if size > self.max_bytes:
            return False
        with self._lock:
            self._sketch.add(digest)
            if digest in self._entries:
                self._remove(digest)
            while self._bytes + size > self.max_bytes and self._entries:
                victim = next(iter(self._entries))
                if self.admission and self._sketch.estimate(digest) <= self._sketch.estimate(
                    victim
                ):
                    self.rejections += 1
                    return False
                self._remove(victim)
                self.evictions += 1
            self._entries[digest] = _Entry(value, size, expires_at)
            self._bytes += size
            return True

    def _remove(self, digest: bytes) -> None:
        entry = self._entries.pop(digest, None)
        if entry is not None:
            self._bytes -= entry.size

    def delete(self, digest: bytes) -> None:
        """Drop one entry."""
        with self._lock:
            self._remove(digest)

    def clear(self) -> None:
        """Drop everything."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
