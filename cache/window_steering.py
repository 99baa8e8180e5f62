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
treats each run of them (below) as a fair coin's toss:

- LRU's lead passes one standard deviation: recency pays on this stream, the window grows by
  three steps (a recency stream loses hits every period it waits);
- the tier's lead passes one standard deviation: frequency pays, the window shrinks by one step;
- otherwise it stays, except that after 8 periods with the very same hits a smaller window is
  tried (else a window grown by a recency phase would never learn that it can shrink).

Two refinements (issue 39; docs/runs/cache.md, sixth session and its second helper):

- *Disagreements come in runs.* A request of a prefix-cache stream is a run of consecutive blocks
  that hit or miss together, so one request can give 10-30 same-side counts in a row; counted as
  independent tosses, one request would decide a period. The noise is therefore the square root
  of the sum of the squared lengths of the runs (consecutive sampled requests with a
  disagreement on the same side; a run also ends when its first key comes again, a new request),
  which is sqrt(n) where disagreements are independent. A period ends: once it has seen
  ``RUNS`` runs (one run is one toss, which no test can pass) and its closed runs hold
  ``EVIDENCE`` units (squared lengths); after ``PERIOD`` of the shadow with no disagreement at
  all (an idle period, as before); after ``LONGEST`` such lengths if it has ``RUNS`` runs (else
  it goes on); and, dropped without a verdict, after such a length with no disagreement since
  its last while it has fewer runs.
- *A way back to the start.* While the window is above its first share, a miniature of the tier
  with its window fixed there (:class:`FixedReference`: the same queues over the sampled keys, the
  tier's sketch for its duels; built from the tier's own sampled entries when the window leaves
  its start) runs beside the shadow LRU. Where it leads LRU past ``Z_BACK`` deviations (counted
  in runs as above, decayed over ``REFERENCE_HORIZON`` disagreements) the window steps back one
  step a period, whatever the tier's own comparison says: at a large window the tier is nearly
  LRU, and without a reference nothing would show that the start does better. At the start the
  tier is its own reference and the miniature is dropped.

The last period's verdict also breaks admission ties (:class:`MemoryTier`): where LRU's lead
passed the growth test (a recency stream) the newer entry wins a tie; a lead inside the noise
leaves ties to the incumbent (on a frequency stream a coin's luck would otherwise let one-offs
in: 0.1-0.2 points on the Zipf replay, docs/runs/cache.md). A step is 6.25 % of the budget
(Caffeine's initial step); a period with no disagreement is half the shadow's entries in
sampled requests (at least 64), one with some ends as above. The sample share is fixed when the
tier first fills, so that the shadow holds about ``TARGET`` entries: small tiers are shadowed
whole, large ones pay one ordered-dictionary operation on one request in 2^k (two while the
miniature runs).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

__all__ = ["FixedReference", "WindowSteering"]

TARGET: Final = 512  # entries the shadow holds, about
STEP: Final = 0.0625  # of the byte budget, per period
PERIOD: Final = 0.5  # sampled requests per period, as a share of the shadow's entries
MIN_PERIOD: Final = 64
Z_GROW: Final = 1.0  # standard deviations LRU's lead must pass to grow the window
Z_SHRINK: Final = 1.0  # and the tier's lead to shrink it
EXPLORE_EVERY: Final = 8  # periods with the very same hits before a smaller window is tried
# Growing steps are this many steps: a recency stream loses hits every period it waits.
GROW: Final = 3
EVIDENCE: Final = 64  # units (squared run lengths) of closed runs that end a period
RUNS: Final = 4  # runs a period holds before its evidence ends it (one run is one toss)
LONGEST: Final = 2  # a period with RUNS runs but few units ends after this many PERIOD lengths
Z_BACK: Final = 2.0  # deviations the fixed-start miniature must lead LRU by to step back
BACK_STEPS: Final = 1  # steps back a period while it does (one: a return, not a jump)
REFERENCE_HORIZON: Final = 512  # the miniature's counts halve at this many disagreements


class FixedReference:
    """A miniature of the tier with its window fixed at its first share, over the sampled keys
    (keys and sizes only): the configuration the window left, kept running beside the shadow.

    Args:
        budget: The shadow's byte budget (the tier's, scaled by the sample share).
        window_max: Its window's bytes (the tier's first share of ``budget``).
        protected_max: Protected's bytes.
        frequency: The tier's sketch estimate for a digest (the duels use the tier's counts).
    """

    def __init__(
        self, budget: int, window_max: int, protected_max: int, frequency: Callable[[bytes], int]
    ) -> None:
        self.budget = budget
        self.window_max = window_max
        self.protected_max = protected_max
        self.frequency = frequency
        self.window: OrderedDict[bytes, int] = OrderedDict()
        self.probation: OrderedDict[bytes, int] = OrderedDict()
        self.protected: OrderedDict[bytes, int] = OrderedDict()
        self.window_bytes = 0
        self.probation_bytes = 0
        self.protected_bytes = 0

    def load(self, queue: int, digest: bytes, size: int) -> None:
        """An entry the tier holds, in its queue (0 window, 1 probation, 2 protected), oldest
        first: the miniature starts as the tier's sampled part."""
        if queue == 0:
            self.window[digest] = size
            self.window_bytes += size
        elif queue == 1:
            self.probation[digest] = size
            self.probation_bytes += size
        else:
            self.protected[digest] = size
            self.protected_bytes += size

    def lookup(self, digest: bytes, size: int) -> bool:
        """One sampled request: whether the miniature held the key (it does after)."""
        window = self.window
        if digest in window:
            window.move_to_end(digest)
            return True
        protected = self.protected
        if digest in protected:
            protected.move_to_end(digest)
            return True
        probation = self.probation
        if digest in probation:
            held = probation.pop(digest)
            protected[digest] = held
            self.probation_bytes -= held
            protected_bytes = self.protected_bytes + held
            while protected_bytes > self.protected_max and len(protected) > 1:
                old, old_size = protected.popitem(False)
                probation[old] = old_size
                protected_bytes -= old_size
                self.probation_bytes += old_size
            self.protected_bytes = protected_bytes
            return True
        window[digest] = size
        self.window_bytes += size
        while self.window_bytes > self.window_max and window:
            candidate, moved = window.popitem(False)
            self.window_bytes -= moved
            self._admit(candidate, moved)
        return False

    def _admit(self, candidate: bytes, size: int) -> None:
        """A candidate from the window duels with the main space's oldest (a tie keeps the
        incumbent: the fixed tier never breaks ties for recency)."""
        total = self.window_bytes + self.probation_bytes + self.protected_bytes + size
        wanted = -1
        while total > self.budget:
            if self.probation:
                source, from_probation = self.probation, True
            elif self.protected:
                source, from_probation = self.protected, False
            else:
                break
            victim = next(iter(source))
            if wanted < 0:
                wanted = self.frequency(candidate)
            if wanted <= self.frequency(victim):
                return  # the candidate goes
            freed = source.pop(victim)
            total -= freed
            if from_probation:
                self.probation_bytes -= freed
            else:
                self.protected_bytes -= freed
        self.probation[candidate] = size
        self.probation_bytes += size


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
        # The current run of disagreements: its length, positive for LRU's side, negative for
        # the tier's, and its first key; units: the period's squared run lengths, the open
        # run's included (read and written by MemoryTier.put too).
        self.run = 0
        self.run_first = b""
        self.units = 0
        self.runs = 0  # runs started this period, the open one included
        self.last = 0  # the period's request count at its last disagreement
        # The fixed-start miniature while the window is above its start (MemoryTier builds it),
        # and its comparison with the shadow: requests only it / only LRU hit, squared run
        # lengths, the current run (signed as above, positive for LRU).
        self.reference: FixedReference | None = None
        self.reference_hits = 0
        self.reference_lru_hits = 0
        self.reference_units = 0
        self.reference_run = 0

    def request(self, digest: bytes, size: int, tier_hit: bool) -> int:
        """Record one request for a sampled key; the bytes by which the window should change
        (0 until a period ends)."""
        shadow = self.shadow
        lru_hit = digest in shadow
        if lru_hit:
            shadow.move_to_end(digest)
        else:
            shadow[digest] = size
            held, budget = self.held + size, self.budget
            while held > budget and shadow:
                held -= shadow.popitem(False)[1]
            self.held = held
        requests = self.requests + 1
        self.requests = requests
        run = self.run
        if lru_hit == tier_hit:  # both hit or both missed: the run ends
            run = 0
        elif lru_hit:  # only LRU hit
            self.lru_hits += 1
            self.last = requests
            if run > 0 and digest != self.run_first:
                run += 1
                self.units += 2 * run - 1
            else:
                run = 1
                self.run_first = digest
                self.units += 1
                self.runs += 1
        else:  # only the tier hit
            self._tier_hits += 1
            self.last = requests
            if run < 0 and digest != self.run_first:
                run -= 1
                self.units -= 2 * run + 1
            else:
                run = -1
                self.run_first = digest
                self.units += 1
                self.runs += 1
        self.run = run
        reference = self.reference
        if reference is not None:
            self.compare(reference.lookup(digest, size), lru_hit)
        return self.period_over(requests, len(shadow))

    def period_over(self, requests: int, entries: int) -> int:
        """0 while the period goes on, else its verdict (see the module's docstring)."""
        units, run = self.units, self.run
        if self.runs >= RUNS and units - run * run >= EVIDENCE:  # enough evidence
            return self.verdict()
        shortest = PERIOD * entries
        if requests < MIN_PERIOD or requests < shortest:
            return 0
        if units == 0:  # an idle period
            return self.verdict()
        shortest = max(MIN_PERIOD, shortest)
        quiet = requests - self.last >= shortest  # no disagreement for a period's length
        if quiet or requests >= LONGEST * shortest:  # a verdict only on enough runs; else a
            if self.runs >= RUNS:  # long period goes on, a quiet one is dropped
                return self.verdict()
            if quiet:
                self._tier_hits = self.lru_hits = self.requests = self.units = self.run = 0
                self.runs = self.last = 0
        return 0

    def compare(self, reference_hit: bool, lru_hit: bool) -> None:
        """One sampled request for the miniature against the shadow LRU."""
        if reference_hit == lru_hit:
            self.reference_run = 0
            return
        run = self.reference_run
        if lru_hit:
            self.reference_lru_hits += 1
            run = run + 1 if run > 0 else 1
            self.reference_units += 2 * run - 1
        else:
            self.reference_hits += 1
            run = run - 1 if run < 0 else -1
            self.reference_units -= 2 * run + 1
        self.reference_run = run
        if self.reference_hits + self.reference_lru_hits >= REFERENCE_HORIZON:
            self.reference_hits >>= 1
            self.reference_lru_hits >>= 1
            self.reference_units >>= 1

    def start_reference(self, reference: FixedReference) -> None:
        """The window leaves its start: the miniature runs from now on, its counts afresh."""
        self.reference = reference
        self.reference_hits = self.reference_lru_hits = 0
        self.reference_units = self.reference_run = 0

    def verdict(self) -> int:
        """The period is over: the bytes by which the window should change, and a new
        period starts."""
        tier, lru, units = self._tier_hits, self.lru_hits, self.units  # only one of them hit
        self._tier_hits = self.lru_hits = self.requests = self.units = self.run = 0
        self.runs = self.last = 0
        if not self.adapts:
            return 0
        # Above its start, the fixed-start miniature clearly beating LRU takes the window one
        # step back toward the start, whatever the tier and LRU did.
        if self.reference is not None and self.reference_hits - self.reference_lru_hits > (
            Z_BACK * math.sqrt(self.reference_units)
        ):
            self.recency = False
            return -BACK_STEPS * self._step
        noise = math.sqrt(units)  # sqrt(tier + lru) where no two disagreements run together
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
