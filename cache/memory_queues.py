"""A memory tier's entries and queues (window, probation, protected) and their upkeep: hits
promoted and counted, the duels that evict when the tier is over budget, the window resized, the
sketch widened, entries removed. :class:`hetero.cache.memory_tier.MemoryTier` adds the reads and
writes that drive them; both are compiled (:mod:`hetero.cache.compiled`)."""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from typing import Any, Final

from hetero.cache.frequency_sketch import (
    _HASH64,
    MAX_COUNT,
    MAX_WIDTH_BITS,
    FrequencySketch,
    _estimate,
)
from hetero.cache.window_steering import FixedReference, WindowSteering

__all__ = [
    "EXPIRES",
    "HASH",
    "PROBATION",
    "PROTECTED",
    "PROTECTED_SHARE",
    "QUEUE",
    "READ_BUFFER",
    "RECENCY_SLACK",
    "SIZE",
    "SKETCH_PER_ENTRY",
    "SLOT0",
    "SLOT1",
    "SLOT2",
    "SLOT3",
    "VALUE",
    "WARM",
    "WINDOW",
    "WINDOW_START",
    "MemoryQueues",
]

# The constants are Final: mypyc (hetero.cache.compiled) then builds them into the code instead
# of looking them up in the module at each use; interpreted, Final changes nothing.

WINDOW_START: Final = 0.01
# Protected's share of the main space (Caffeine: 0.8; docs/cache.md has the replay for both).
PROTECTED_SHARE: Final = 0.6
READ_BUFFER: Final = 64
# No eviction batches: a write that takes the tier over budget evicts at once. Candidates that
# wait in the window for a batch make a larger window, which cost up to 1.4 points of hit rate on
# the replay (docs/cache.md); a batch only moved the cost from the median write to the mean.
SKETCH_PER_ENTRY: Final = 16  # counters per row for each entry held: slow ageing, few collisions
RECENCY_SLACK: Final = 1  # on a recency stream a candidate this much less frequent still enters
# A warm candidate (6 counts past the doorkeeper, Caffeine's threshold) that loses still enters 1
# time in 128 (Caffeine's jitter).
WARM: Final = 7

# An entry is a flat list (cheaper to build and read than an object, and one unpacking gives
# every field); these are its fields, the last four the key's counter in each sketch row.
VALUE: Final = 0
SIZE: Final = 1
EXPIRES: Final = 2
QUEUE: Final = 3
HASH: Final = 4
SLOT0: Final = 5
SLOT1: Final = 6
SLOT2: Final = 7
SLOT3: Final = 8
WINDOW: Final = 0
PROBATION: Final = 1
PROTECTED: Final = 2


class MemoryQueues:
    """A memory tier's state: its entries by digest, the three queues and their bytes, the
    sketch, the window steering; and what keeps them within budget. The arguments are
    :class:`~hetero.cache.memory_tier.MemoryTier`'s."""

    def __init__(self, max_bytes: int, adaptive: bool = True) -> None:
        self.max_bytes = max_bytes
        self._adaptive = adaptive
        self._data: dict[bytes, list[Any]] = {}
        self._window: OrderedDict[bytes, list[Any]] = OrderedDict()
        self._probation: OrderedDict[bytes, list[Any]] = OrderedDict()
        self._protected: OrderedDict[bytes, list[Any]] = OrderedDict()
        self._queues = (self._window, self._probation, self._protected)
        self._bytes = [0, 0, 0]  # per queue
        self._held = 0  # their sum, kept by every write and removal (one read per write)
        self.window_max = max(1, int(max_bytes * WINDOW_START))
        self._start = self.window_max  # the window's first share, in bytes
        self._sketch = FrequencySketch(64)
        self._grow_at = self._sketch.width // SKETCH_PER_ENTRY  # entries that want a wider one
        self._reads: list[list[Any]] = []
        self._steering: WindowSteering | None = None  # from the first eviction on
        self._lock = threading.Lock()
        self._random = random.Random(0)
        self.evictions = 0
        self.rejections = 0

    @property
    def size_bytes(self) -> int:
        """Bytes held."""
        return self._held

    def __len__(self) -> int:
        return len(self._data)

    # --- hits --------------------------------------------------------------------------------

    def _promote(self, digest: bytes, entry: list[Any]) -> None:
        """A probation entry asked for again moves to protected; protected's oldest go back to
        probation while protected is over its share."""
        probation, protected, sizes = self._probation, self._protected, self._bytes
        del probation[digest]
        protected[digest] = entry
        entry[QUEUE] = PROTECTED
        sizes[PROBATION] -= entry[SIZE]
        sizes[PROTECTED] += entry[SIZE]
        limit = (self.max_bytes - self.window_max) * PROTECTED_SHARE
        while sizes[PROTECTED] > limit and len(protected) > 1:
            old_digest, old = protected.popitem(last=False)
            probation[old_digest] = old
            old[QUEUE] = PROBATION
            sizes[PROTECTED] -= old[SIZE]
            sizes[PROBATION] += old[SIZE]

    def _drain(self) -> None:
        """The buffered hits reach the sketch (FrequencySketch.increment, inlined)."""
        sketch = self._sketch
        door, sample = sketch.door, sketch.sample
        row0, row1, row2, row3 = sketch.rows  # halve() keeps the rows: they stay valid
        added = sketch.added
        for _, _, _, _, key_hash, a, b, c, d in self._reads:
            if key_hash in door:
                if row0[a] < MAX_COUNT:
                    row0[a] += 1
                if row1[b] < MAX_COUNT:
                    row1[b] += 1
                if row2[c] < MAX_COUNT:
                    row2[c] += 1
                if row3[d] < MAX_COUNT:
                    row3[d] += 1
            else:
                door.add(key_hash)
            added += 1
            if added >= sample:
                sketch.added = added
                sketch.halve()
                added = sketch.added
        sketch.added = added
        self._reads.clear()

    # --- eviction ----------------------------------------------------------------------------

    def _evict(self, arriving: tuple[bytes, list[Any]] | None) -> None:
        """Window overflow becomes candidates for the main space, newest first (see
        :meth:`_duel`). ``arriving``: a new entry that skips an empty window too small for it
        (the same duel as entering and leaving it at once, without the two queue operations)."""
        if self._reads:  # duels see every request so far
            self._drain()
        if self._steering is None:  # full for the first time: the sample share is set now
            self._steering = WindowSteering(self.max_bytes, len(self._data), self._adaptive)
        sizes = self._bytes
        total = sizes[0] + sizes[1] + sizes[2]
        if arriving is not None:
            candidates = [arriving]
            total += arriving[1][SIZE]
        else:
            candidates = self._leaving_window()
        self._evict_candidates(candidates, total)

    def _evict_candidates(self, candidates: list[tuple[bytes, list[Any]]], total: int) -> None:
        """Each candidate duels in turn; if the tier is still over budget, the oldest go."""
        sketch = self._sketch
        for digest, entry in candidates:
            total = self._duel(digest, entry, _estimate(sketch, entry), total)
        if total > self.max_bytes:
            total = self._drop_oldest(total)
        self._held = total

    def _duel(self, digest: bytes, entry: list[Any], wanted: int, total: int) -> int:
        """While the tier is over budget (``total`` bytes with the candidate) the candidate,
        asked for ``wanted`` times, duels on frequency with the main space's oldest entry
        (probation's, else protected's) and the loser goes (Caffeine's evictFromMain). The
        bytes held after."""
        probation, protected, data, sizes = (
            self._probation,
            self._protected,
            self._data,
            self._bytes,
        )
        max_bytes = self.max_bytes
        sketch = self._sketch
        recency = self._steering.recency if self._steering is not None else False
        evicted = 0
        while total > max_bytes:
            source = probation or protected
            if not source:
                break
            victim, held = source.popitem(False)  # the oldest, back at the head if it wins
            # The duel (Caffeine's admit): the candidate enters if it is asked for more often
            # than the victim; a tie keeps the victim (a stream of one-offs cannot wash out
            # the main space) unless the steering's last period found LRU hitting at least as
            # often (a recency stream: the newer entry is the better bet); a warm candidate
            # sometimes wins a lost duel, so nobody can pin a victim by keeping its frequency
            # just above everything else.
            incumbent = _estimate(sketch, held)
            if (
                wanted > incumbent
                or (recency and wanted + RECENCY_SLACK >= incumbent)
                or (wanted < incumbent and wanted >= WARM and self._random.random() < 1 / 128)
            ):
                del data[victim]
                sizes[held[QUEUE]] -= held[SIZE]
                total -= held[SIZE]
                evicted += 1
            else:
                source[victim] = held
                source.move_to_end(victim, False)
                self.evictions += evicted + 1
                self.rejections += 1
                del data[digest]
                left: int = total - entry[SIZE]
                return left
        probation[digest] = entry
        entry[QUEUE] = PROBATION
        sizes[PROBATION] += entry[SIZE]
        self.evictions += evicted
        return total

    def _leaving_window(self) -> list[tuple[bytes, list[Any]]]:
        """The window's overflow, newest first."""
        window, sizes, window_max = self._window, self._bytes, self.window_max
        leaving = []
        while sizes[WINDOW] > window_max and window:
            digest, entry = window.popitem(last=False)
            sizes[WINDOW] -= entry[SIZE]
            leaving.append((digest, entry))
        if len(leaving) > 1:
            leaving.reverse()
        return leaving

    def _drop_oldest(self, total: int) -> int:
        """No candidate left to duel: the oldest entries go until the tier fits (``total``
        bytes with the candidates); the bytes held after."""
        data, sizes = self._data, self._bytes
        window, probation, protected = self._window, self._probation, self._protected
        while total > self.max_bytes:
            queue = probation or protected or window
            victim, held = queue.popitem(last=False)
            del data[victim]
            sizes[held[QUEUE]] -= held[SIZE]
            total -= held[SIZE]
            self.evictions += 1
        return total

    # --- window adaptation ------------------------------------------------------------------

    def _resize_window(self, wanted: float) -> None:
        """A smaller window hands its oldest entries to probation; a larger one takes
        probation's oldest (then protected's) so the main space fits its new share."""
        window_max = int(min(max(wanted, 1), self.max_bytes))
        steering = self._steering
        if steering is not None and steering.adapts:
            if window_max <= self._start:  # at (or below) its start: its own reference
                steering.reference = None
            elif steering.reference is None:  # it leaves its start: the fixed-start reference
                steering.start_reference(self._fixed_reference(steering))
        self.window_max = window_max
        window, probation, protected = self._window, self._probation, self._protected
        sizes = self._bytes
        self._window_to_probation()
        main_max = self.max_bytes - self.window_max
        while sizes[PROBATION] + sizes[PROTECTED] > main_max:
            source = probation or protected
            if not source:
                break
            digest, entry = source.popitem(last=False)
            window[digest] = entry
            sizes[entry[QUEUE]] -= entry[SIZE]
            entry[QUEUE] = WINDOW
            sizes[WINDOW] += entry[SIZE]

    def _fixed_reference(self, steering: WindowSteering) -> FixedReference:
        """The steering's miniature of this tier with its window at the start, loaded with the
        tier's sampled entries in their queues, oldest first."""
        budget = steering.budget
        window_max = max(1, int(budget * WINDOW_START))
        reference = FixedReference(
            budget, window_max, int((budget - window_max) * PROTECTED_SHARE), self._frequency
        )
        mask = steering.mask
        for queue in self._queues:
            for digest, entry in queue.items():
                if not digest[8] & mask:
                    reference.load(entry[QUEUE], digest, entry[SIZE])
        return reference

    def _frequency(self, digest: bytes) -> int:
        """The sketch's estimate for a digest (held or not), as a duel reads it."""
        sketch = self._sketch
        (key_hash,) = _HASH64(digest)
        return sketch.frequency(key_hash, sketch.slots(key_hash))

    def _window_to_probation(self) -> None:
        """The window's oldest entries move to probation, in order, until it fits its share:
        with no duel, so only where nothing has to be evicted (the first fill, a smaller
        window)."""
        window, probation, sizes = self._window, self._probation, self._bytes
        while sizes[WINDOW] > self.window_max and window:
            digest, entry = window.popitem(last=False)
            probation[digest] = entry
            entry[QUEUE] = PROBATION
            sizes[WINDOW] -= entry[SIZE]
            sizes[PROBATION] += entry[SIZE]

    def _grow_sketch(self) -> None:
        """Fewer counters per row than the entries held want: a wider sketch. The counts carry
        over (unlike Caffeine's ensureCapacity, which restarts them): a key's slot in the wider
        row keeps the low bits of its old one, so each row is the old one repeated, and every
        held key's estimate stays what it was. The doorkeeper is rebuilt at its new size with
        the keys held that had passed it."""
        old = self._sketch
        self._sketch = FrequencySketch(SKETCH_PER_ENTRY * len(self._data))
        width = self._sketch.width
        times = width // old.width
        self._sketch.rows = tuple(row * times for row in old.rows)
        self._sketch.added = old.added
        self._grow_at = width // SKETCH_PER_ENTRY if width < 1 << MAX_WIDTH_BITS else 1 << 62
        old_door, door, slots = old.door, self._sketch.door, self._sketch.slots
        for entry in self._data.values():
            key_hash = entry[HASH]
            if key_hash in old_door:
                door.add(key_hash)
            entry[SLOT0 : SLOT3 + 1] = slots(key_hash)
        for entry in self._reads:
            entry[SLOT0 : SLOT3 + 1] = slots(entry[HASH])

    # --- removal -----------------------------------------------------------------------------

    def _remove(self, digest: bytes) -> None:
        entry = self._data.pop(digest, None)
        if entry is not None:
            del self._queues[entry[QUEUE]][digest]
            self._bytes[entry[QUEUE]] -= entry[SIZE]
            self._held -= entry[SIZE]

    def delete(self, digest: bytes) -> None:
        """Drop one entry."""
        with self._lock:
            self._remove(digest)

    def clear(self) -> None:
        """Drop every entry (the sketch keeps its counts: they describe the traffic)."""
        with self._lock:
            self._data.clear()
            for queue in self._queues:
                queue.clear()
            self._bytes = [0, 0, 0]
            self._held = 0
            self._reads.clear()
