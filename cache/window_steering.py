"""How large the memory tier's admission window should be: a shadow LRU on a sample of the keys.

Caffeine sizes its window by hill climbing: every sample period it compares its hit rate with the
previous period's and keeps moving the window in the direction that helped. Replayed on our
streams (docs/cache.md has the figures) that climber mostly follows the stream rather than the
window: while a cache warms up, or a stream drifts, every period is better or worse than the
last whatever the window did, so on the Mooncake stream it walked the window to 0 % and lost 5-7
points to LRU.

Here the comparison is made in the same period, on the same requests: a shadow LRU (keys and
sizes only, no values) sees the requests of a spatial sample of the keys (the keys whose digest has
its sampling bits zero, as SHARDS samples, Waldspurger et al., FAST'15), with the tier's byte
budget scaled by the same share. Each period counts the requests only one of the two hit, and
treats that count as a fair coin's tosses:

- LRU's lead passes one standard deviation: recency pays on this stream, the window grows by
  three steps (a recency stream loses hits every period it waits);
- the tier's lead passes one standard deviation: frequency pays, the window shrinks by one step;
- otherwise it stays, except that after 8 periods with the very same hits a smaller window is
  tried (else a window grown by a recency phase would never learn that it can shrink).

The last period's verdict also breaks admission ties (:class:`MemoryTier`): where LRU's lead
passed the growth test (a recency stream) the newer entry wins a tie; a lead inside the noise
leaves ties to the incumbent (on a frequency stream a coin's luck would otherwise let one-offs
in: 0.1-0.2 points on the Zipf replay, docs/cache.md). A step is 6.25 % of the budget
(Caffeine's initial step); a period is half the shadow's entries in sampled requests (at least
64). The sample share is fixed when the tier first fills, so that the shadow holds about
``TARGET`` entries: small tiers are shadowed whole, large ones pay one ordered-dictionary
operation on one request in 2^k.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Final

__all__ = ["WindowSteering"]

TARGET: Final = 512  # entries the shadow holds, about
STEP: Final = 0.0625  # of the byte budget, per period
PERIOD: Final = 0.5  # sampled requests per period, as a share of the shadow's entries
MIN_PERIOD: Final = 64
Z_GROW: Final = 1.0  # standard deviations LRU's lead must pass to grow the window
Z_SHRINK: Final = 1.0  # and the tier's lead to shrink it
EXPLORE_EVERY: Final = 8  # periods with the very same hits before a smaller window is tried
# Growing steps are this many steps: a recency stream loses hits every period it waits.
GROW: Final = 3


class WindowSteering:
    """A shadow LRU over sampled keys, and the window change it asks for.

    Args:
        max_bytes: The tier's byte budget.
        entries: Entries the tier holds when it first fills (sets the sample share).
        adapts: False for a fixed window: the shadow runs (the same work) but no period asks
            for a change and no period finds recency (the reference ``hetero bench cache``
            replays beside the adaptive tier).
    """

    def __init__(self, max_bytes: int, entries: int, adapts: bool = True) -> None:
        self.adapts = adapts
        self.shift = (max(1, entries // TARGET)).bit_length() - 1
        # Sampled: the low ``shift`` bits of the digest's ninth byte are zero (the sketch's
        # slots use bytes 0-7), so at most one key in 256 when the tier is very large.
        self.mask = ((1 << self.shift) - 1) & 0xFF
        # Read and written by MemoryTier.put too (this class's request() for a tier miss,
        # inlined there: it is every sampled miss's path).
        self.budget = max_bytes >> self.shift
        self._step = int(STEP * max_bytes)
        self.shadow: OrderedDict[bytes, int] = OrderedDict()
        self.held = 0  # the shadow's bytes
        self.requests = 0
        self._tier_hits = 0
        self.lru_hits = 0
        self._idle = 0
        self.recency = False  # whether LRU clearly hit more often in the last period

    def request(self, digest: bytes, size: int, tier_hit: bool) -> int:
        """Record one request for a sampled key; the bytes by which the window should change
        (0 until a period ends)."""
        shadow = self.shadow
        if digest in shadow:  # an LRU hit: it counts if the tier missed
            shadow.move_to_end(digest)
            if not tier_hit:
                self.lru_hits += 1
        else:  # an LRU miss: it counts if the tier hit
            shadow[digest] = size
            held, budget = self.held + size, self.budget
            while held > budget and shadow:
                held -= shadow.popitem(False)[1]
            self.held = held
            if tier_hit:
                self._tier_hits += 1
        requests = self.requests + 1
        self.requests = requests
        if requests < MIN_PERIOD or requests < PERIOD * len(shadow):
            return 0
        return self.verdict()

    def verdict(self) -> int:
        """The period is over: the bytes by which the window should change, and a new
        period starts."""
        tier, lru = self._tier_hits, self.lru_hits  # requests only one of them hit
        self._tier_hits = self.lru_hits = self.requests = 0
        if not self.adapts:
            return 0
        noise = math.sqrt(tier + lru)
        # Recency breaks admission ties only on the evidence that grows the window: a lead
        # inside the noise (or no lead) keeps the frequency filter's ties for the incumbent.
        self.recency = lru - tier > Z_GROW * noise
        if lru - tier > Z_GROW * noise:
            return GROW * self._step
        if tier - lru > Z_SHRINK * noise:
            return -self._step
        if tier + lru == 0:  # the same hits: try a smaller window now and then (else a window
            self._idle += 1  # grown by a recency phase would never learn it can shrink)
            if self._idle % EXPLORE_EVERY == 0:
                return -self._step
        return 0
