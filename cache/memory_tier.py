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

This module holds the reads and writes (the hot paths); the queues' upkeep that
:class:`MemoryTier` extends is :mod:`hetero.cache.memory_queues`, the sketch
:mod:`hetero.cache.frequency_sketch`.
"""

from __future__ import annotations

from typing import Any

from hetero.cache.frequency_sketch import _HASH64, _PIECES, MAX_COUNT, FrequencySketch
from hetero.cache.memory_queues import (
    EXPIRES,
    PROBATION,
    PROTECTED,
    QUEUE,
    READ_BUFFER,
    RECENCY_SLACK,
    SIZE,
    VALUE,
    WARM,
    WINDOW,
    MemoryQueues,
)

__all__ = ["FrequencySketch", "MemoryTier"]

# The builtin min() of four counters costs 290 ns against 120 ns for the comparisons written
# out (timed here): the hot paths compare by hand.
# ruff: noqa: PLR1730


class MemoryTier(MemoryQueues):
    """A byte-bounded map from key digests to decoded values (W-TinyLFU).

    Args:
        max_bytes: The byte budget.
        adaptive: False keeps the window at its first share (1 %) and never breaks a tie for
            recency: the fixed-window W-TinyLFU, the reference ``hetero bench cache`` replays.
    """

    name = "memory"

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
