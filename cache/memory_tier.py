"""L1: in-process memory, bounded in bytes, W-TinyLFU eviction and admission.

Multimodal traffic is skewed with a long tail of one-off content (a new photo, a stranger's
voice), but some streams reuse by recency (prompt prefixes, a document read page after page).
Plain LRU lets every one-off push out an entry asked for again and again; a pure frequency
filter in front of LRU refuses the newcomers a recency stream asks for next. W-TinyLFU
(Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", ACM ToS
2017; Caffeine's design) does both:

- a small LRU **admission window** (1 % of the bytes at first) takes every new entry;
- what falls out of the window is a candidate for the **main space**, a segmented LRU
  (probation, and protected for entries hit while on probation, at most 60 % of the main space):
  a candidate enters only if a count-min sketch of recent frequencies says it is asked for
  more often than the probation entry it would evict (a tie keeps the incumbent, unless the
  stream is led by recency: then a tie, or a candidate one count below, enters); otherwise the
  candidate goes. Until the tier first fills there is nothing to evict: what falls out of the
  window enters probation at once, oldest first, so the main space fills in recency order;
- the sketch has 4-bit counters, a **doorkeeper** (a Bloom filter that absorbs the first
  request of each key, so one-offs never reach the counters) and **ages**: every ``10 x`` its
  width in requests all counters halve and the doorkeeper is cleared; it widens as the tier
  holds more entries, keeping its counts;
- the **window adapts** to the stream, steered by a shadow LRU over a sample of the keys
  (:mod:`hetero.cache.window_steering`): when LRU would have hit more in the last period the
  window grows, when the tier hit clearly more it shrinks. Recency streams end up with a large
  window (LRU-like), frequency streams with a small one. This replaces Caffeine's hill climber,
  which compares a period with the previous one and so follows the stream's own drift
  (docs/cache.md has the figures).

Capacity is in bytes (a value's size is its encoded length); the window, probation and protected
budgets are byte shares; a write that takes the tier over budget evicts at once. Hits are
recorded in a buffer applied to the sketch in batches (as Caffeine's read buffer), so a hit is a
dictionary lookup and a move in an ordered dictionary. Key hashes are the digest's own bytes, so
the same stream gives the same decisions in every process.
Entries carry their own expiry, checked when read; an expired entry never read again leaves
through normal eviction.
"""

from __future__ import annotations

import random
import struct
import threading
from collections import OrderedDict
from typing import Any, Final

from rbloom import Bloom

from hetero.cache.window_steering import FixedReference, WindowSteering

__all__ = ["FrequencySketch", "MemoryTier"]

# The builtin min() of four counters costs 290 ns against 120 ns for the comparisons written
# out (timed here): the hot paths compare by hand.
# ruff: noqa: PLR1730

# The constants are Final: mypyc (hetero.cache.compiled) then builds them into the code instead
# of looking them up in the module at each use; interpreted, Final changes nothing.

MAX_COUNT: Final = 15
MAX_WIDTH_BITS: Final = 16  # a key's four counters are four 16-bit pieces of its 64-bit hash
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

Slots = tuple[int, int, int, int]
# A digest's first 8 bytes: as one 64-bit int (the doorkeeper's key) and as four 16-bit pieces
# (the sketch's four rows); struct reads both without building a wider int to shift.
_HASH64: Final = struct.Struct("<Q").unpack_from
_PIECES: Final = struct.Struct("<4H").unpack_from


class FrequencySketch:
    """A count-min sketch of 4-bit counters behind a doorkeeper, halved periodically.

    Four rows of ``width`` counters, one ``bytearray`` each; a key's four counters come from
    four 16-bit pieces of its hash (the key is a BLAKE2b digest, so the pieces are independent),
    masked to the width: a row's own index, no offset to add. The doorkeeper is an rbloom filter
    of the keys seen since the last halving.
    """

    def __init__(self, width: int) -> None:
        self.width = 1 << min(MAX_WIDTH_BITS, max(6, (width - 1).bit_length()))
        self.mask = self.width - 1
        self.rows = tuple(bytearray(self.width) for _ in range(4))
        self.sample = 10 * self.width
        self.door = Bloom(self.sample, 0.01)
        self.added = 0  # requests counted since the last halving

    def slots(self, key_hash: int) -> Slots:
        """The key's four counters (one index in each row)."""
        mask = self.mask
        return (
            key_hash & mask,
            (key_hash >> 16) & mask,
            (key_hash >> 32) & mask,
            (key_hash >> 48) & mask,
        )

    def increment(self, key_hash: int, slots: Slots) -> None:
        """Count one request: the first since the last halving only passes the doorkeeper."""
        door = self.door
        if key_hash in door:
            for row, slot in zip(self.rows, slots, strict=True):
                if row[slot] < MAX_COUNT:
                    row[slot] += 1
        else:
            door.add(key_hash)
        self.added += 1
        if self.added >= self.sample:
            self.halve()

    def frequency(self, key_hash: int, slots: Slots) -> int:
        """How often the key was asked for recently (an upper bound)."""
        row0, row1, row2, row3 = self.rows
        a, b, c, d = slots
        return min(row0[a], row1[b], row2[c], row3[d]) + (key_hash in self.door)

    def halve(self) -> None:
        """Age: every counter halves (in place: the rows stay the same objects, so a caller
        holding them reads the halved counts) and the doorkeeper forgets."""
        for row in self.rows:
            row[:] = row.translate(_HALF)
        self.door.clear()
        self.added //= 2


_HALF = bytes(value >> 1 for value in range(256))


def _estimate(sketch: FrequencySketch, entry: list[Any]) -> int:
    """An entry's frequency (FrequencySketch.frequency over the entry's own fields)."""
    row0, row1, row2, row3 = sketch.rows
    _, _, _, _, key_hash, a, b, c, d = entry
    count: int = row0[a]
    if row1[b] < count:
        count = row1[b]
    if row2[c] < count:
        count = row2[c]
    if row3[d] < count:
        count = row3[d]
    return count + (key_hash in sketch.door)


class MemoryTier:
    """A byte-bounded map from key digests to decoded values (W-TinyLFU).

    Args:
        max_bytes: The byte budget.
        adaptive: False keeps the window at its first share (1 %) and never breaks a tie for
            recency: the fixed-window W-TinyLFU, the reference ``hetero bench cache`` replays.
    """

    name = "memory"

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

    # --- reads -------------------------------------------------------------------------------

    def get(self, digest: bytes, now: float) -> Any | None:
        """The value, or None (missing or expired). A hit is recorded for the sketch; a miss
        counts when the computed value is offered to :meth:`put`."""
        if digest not in self._data:  # a miss needs no lock: one dictionary read is atomic
            return None
        lock = self._lock  # acquire/release: 60-90 ns a call less than `with`
        lock.acquire()
        try:
            entry = self._data.get(digest)
            if entry is None:
                return None
            if entry[EXPIRES] <= now:
                self._remove(digest)
                return None
            queue = entry[QUEUE]
            if queue == PROBATION:
                self._promote(digest, entry)
            elif queue == PROTECTED:
                self._protected.move_to_end(digest)
            else:
                self._window.move_to_end(digest)
            reads = self._reads
            reads.append(entry)
            if len(reads) >= READ_BUFFER:
                self._drain()
            steering = self._steering
            if steering is not None and not digest[8] & steering.mask:
                change = steering.request(digest, entry[SIZE], True)
                if change:
                    self._resize_window(self.window_max + change)
            return entry[VALUE]
        finally:
            lock.release()

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

    # --- writes ------------------------------------------------------------------------------

    def put(self, digest: bytes, value: Any, size: int, expires_at: float) -> bool:  # noqa: PLR0915
        """Store: the window takes every new entry, and whether it enters the main space is
        decided when it leaves the window. False if it is not held once this returns (larger
        than the tier, or evicted at once)."""
        max_bytes = self.max_bytes
        if size > max_bytes:
            return False
        lock = self._lock  # acquire/release: 60-90 ns a call less than `with`
        lock.acquire()
        try:
            data = self._data
            steering = self._steering
            if digest in data:
                self._remove(digest)
            elif steering is not None and not digest[8] & steering.mask:
                if steering.reference is not None:  # the window is above its start
                    change = steering.request(digest, size, False)
                else:  # steering.request(digest, size, False), inlined: most sampled misses
                    shadow = steering.shadow
                    requests = steering.requests + 1
                    steering.requests = requests
                    if digest in shadow:  # only LRU hit: the run goes on or a new one starts
                        shadow.move_to_end(digest)
                        steering.lru_hits += 1
                        steering.last = requests
                        run = steering.run
                        if run > 0 and digest != steering.run_first:
                            run += 1
                            steering.units += 2 * run - 1
                        else:
                            run = 1
                            steering.run_first = digest
                            steering.units += 1
                            steering.runs += 1
                        steering.run = run
                    else:  # both missed: the run ends
                        shadow[digest] = size
                        held_bytes, budget = steering.held + size, steering.budget
                        while held_bytes > budget and shadow:
                            held_bytes -= shadow.popitem(False)[1]
                        steering.held = held_bytes
                        steering.run = 0
                    change = steering.period_over(requests, len(shadow))
                if change:
                    self._resize_window(self.window_max + change)
            # The digest's own bits (not hash(), which differs between processes): the same
            # stream gives the same decisions everywhere. The sketch's slots and the
            # doorkeeper use bytes 0-7, the steering's sample byte 8.
            sketch = self._sketch
            mask = sketch.mask
            a, b, c, d = _PIECES(digest)
            a &= mask
            b &= mask
            c &= mask
            d &= mask
            (key_hash,) = _HASH64(digest)
            entry = [value, size, expires_at, WINDOW, key_hash, a, b, c, d]
            data[digest] = entry
            # The sketch counts the write at once (the duel this write may start needs it), and
            # the same reads give the entry's own estimate: FrequencySketch.increment and
            # frequency fused, as this is every miss's path.
            door = sketch.door
            row0, row1, row2, row3 = sketch.rows  # halve() keeps the rows: they stay valid
            if key_hash in door:
                wanted = row0[a]
                if wanted < MAX_COUNT:
                    wanted += 1
                    row0[a] = wanted
                count = row1[b]
                if count < MAX_COUNT:
                    count += 1
                    row1[b] = count
                if count < wanted:
                    wanted = count
                count = row2[c]
                if count < MAX_COUNT:
                    count += 1
                    row2[c] = count
                if count < wanted:
                    wanted = count
                count = row3[d]
                if count < MAX_COUNT:
                    count += 1
                    row3[d] = count
                if count < wanted:
                    wanted = count
            else:
                door.add(key_hash)
                wanted = row0[a]
                count = row1[b]
                if count < wanted:
                    wanted = count
                count = row2[c]
                if count < wanted:
                    wanted = count
                count = row3[d]
                if count < wanted:
                    wanted = count
            wanted += 1  # the doorkeeper holds it now
            added = sketch.added + 1
            sketch.added = added
            if added >= sketch.sample:
                sketch.halve()
                wanted = -1  # the counts changed: read again below
            total = self._held + size
            window = self._window
            if total <= max_bytes:
                window[digest] = entry
                sizes = self._bytes
                sizes[WINDOW] += size
                self._held = total
                # Not full yet: the window's overflow goes to probation now, oldest first (as
                # Caffeine's evictFromWindow), so the main space fills in recency order. Left
                # in the window until the first eviction, it would leave newest first and
                # enter probation reversed: the fill's newest entries would be the first
                # victims (0.4-0.6 points on the Zipf replay at 25 %).
                if sizes[WINDOW] > self.window_max:
                    self._window_to_probation()
                if len(data) > self._grow_at:
                    self._grow_sketch()
                return True
            sizes = self._bytes
            if steering is None:  # the first fill (the steering starts): _evict
                if window or size <= self.window_max:
                    window[digest] = entry
                    sizes[WINDOW] += size
                    self._evict(None)
                else:  # the window cannot hold it even alone: it is at once the candidate
                    self._evict((digest, entry))
                if len(data) > self._grow_at:
                    self._grow_sketch()
                return digest in data
            # The common full-tier write, inlined (as _evict and _duel do it, without their
            # calls and lists): one candidate, the window's oldest or the new entry itself when
            # the window cannot hold it, duels with the main space's oldest.
            if self._reads:  # duels see every request so far (after this write's count, as
                self._drain()  # in _evict)
                wanted = -1
            window_max = self.window_max
            if window or size <= window_max:
                window[digest] = entry
                window_bytes = sizes[WINDOW] + size
                sizes[WINDOW] = window_bytes
                if window_bytes <= window_max:  # none leaves the window
                    self._evict(None)
                    return digest in data
                candidate, held = window.popitem(False)
                _, moved, _, _, key_hash, a, b, c, d = held
                window_bytes -= moved
                sizes[WINDOW] = window_bytes
                if window_bytes > window_max and window:  # several leave: _evict's path
                    leaving = [(candidate, held)]
                    while sizes[WINDOW] > window_max and window:
                        candidate, held = window.popitem(False)
                        sizes[WINDOW] -= held[SIZE]
                        leaving.append((candidate, held))
                    leaving.reverse()
                    self._evict_candidates(leaving, total)
                    return digest in data
                wanted = -1  # the candidate is an older entry: its own estimate below
            else:  # the new entry is the candidate (a, b, c, d and key_hash are its own)
                candidate, held, moved = digest, entry, size
            if wanted < 0:
                wanted = row0[a]
                count = row1[b]
                if count < wanted:
                    wanted = count
                count = row2[c]
                if count < wanted:
                    wanted = count
                count = row3[d]
                if count < wanted:
                    wanted = count
                wanted += key_hash in door
            probation = self._probation
            recency = steering.recency
            admitted = True
            evicted = 0
            while total > max_bytes:  # _duel, inlined
                source = probation or self._protected
                if not source:
                    break
                victim, old = source.popitem(False)
                _, freed, _, queue, key_hash, a, b, c, d = old
                incumbent = row0[a]
                count = row1[b]
                if count < incumbent:
                    incumbent = count
                count = row2[c]
                if count < incumbent:
                    incumbent = count
                count = row3[d]
                if count < incumbent:
                    incumbent = count
                incumbent += key_hash in door
                if (
                    wanted > incumbent
                    or (recency and wanted + RECENCY_SLACK >= incumbent)
                    or (wanted < incumbent and wanted >= WARM and self._random.random() < 1 / 128)
                ):
                    del data[victim]
                    sizes[queue] -= freed
                    total -= freed
                    evicted += 1
                else:
                    source[victim] = old
                    source.move_to_end(victim, False)
                    admitted = False
                    break
            if admitted:
                probation[candidate] = held
                held[QUEUE] = PROBATION
                sizes[PROBATION] += moved
            else:
                del data[candidate]
                total -= moved
                self.rejections += 1
                evicted += 1
            self.evictions += evicted
            # No sketch growth to check here: a write on a full tier leaves as many entries or
            # fewer (the new one came in, and a victim or a candidate left).
            if total > max_bytes:  # nobody left to duel with
                self._held = self._drop_oldest(total)
                return digest in data
            self._held = total
            return admitted or candidate is not digest  # else the new entry lost its duel
        finally:
            lock.release()

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
