"""The feature cache's reads: memory, then the Bloom filter where it pays, then the lower tiers
fastest first, a hit promoted to the faster tiers; the cost of each lower tier's read kept up to
date on a sample of them, and with it whether the Bloom filter is asked first."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from hetero.cache.codec import decode, decode_from
from hetero.cache.feature_tiers import FeatureTiers, _Tier
from hetero.cache.keys import FeatureKey
from hetero.cache.memory_tier import MemoryTier
from hetero.framework.cipher import Cipher

__all__ = ["FeatureReads"]

logger = logging.getLogger(__name__)

SMOOTHING = 0.2
SAMPLE_EVERY = 16
WEIGH_OVER = 64  # lookups below memory in one weighing of the Bloom filter's place, at least
_monotonic = time.monotonic
# The clock of the costs timed while serving (the sampled reads, the Bloom check each weighing
# re-times): a module name, so a test can run the weighing on a clock it drives.
_perf = time.perf_counter


class FeatureReads(FeatureTiers):
    """:class:`~hetero.cache.feature_cache.FeatureCache`'s reads."""

    # --- reads -----------------------------------------------------------------------------

    def get(self, key: FeatureKey) -> Any | None:
        """The cached value, or None."""
        return self.lookup(key)[0]

    def lookup(self, key: FeatureKey) -> tuple[Any | None, str | None]:
        """(the cached value, the tier that had it), or (None, None) on a miss."""
        if not self._enabled:
            return None, None
        if self._plain or key.partition is None:
            cipher = None
        else:
            cacheable, cipher = self._protection(key)
            if not cacheable:
                return None, None
        memory = self.memory
        if memory is not None:
            value = memory.get(key.digest, _monotonic())
            if value is not None:
                self._hits["memory"] += 1
                return value, "memory"
        if self._gate and not self.bloom.might_contain(key.digest):
            self.metrics.bloom_negative_count += 1
            self._rejected += 1
            return None, None
        reads = self._reads + 1
        self._reads = reads
        if reads % SAMPLE_EVERY:
            # The common read (costs are tracked on a sample): no timing, and _accept inlined
            # for a hit in the first lower tier with no faster tier to promote its bytes to and
            # nothing to decrypt (an L3 hit): the tier's record is read and decoded in place,
            # the value's bytes copied once (DiskTier.read, decode_from).
            text = key.text
            lower = self._lower  # one list throughout: _order swaps in a new one
            index = -1
            for tier in lower:
                index += 1
                if index or cipher is not None:
                    blob = tier.get(text)
                    if blob is None:
                        continue
                    found = tier.name
                    value = self._accept(tier, key, cipher, blob, lower[:index])
                else:
                    stored = tier.read(text)
                    if stored is None:
                        continue
                    found = tier.name
                    record, start = stored
                    try:
                        value = decode_from(record, start, found)
                    except Exception as err:
                        self._unreadable(tier, key, err)
                        continue
                    self._hits[found] += 1
                    if memory is not None:  # _accept's promotion, to memory alone
                        self._into_memory(memory, key, value, len(record) - start)
                if value is not None:
                    return value, found
            value, name = None, None
        else:
            value, name = self._read_lower_timed(key, cipher)
            self._weigh_bloom()
        if value is None:
            self.metrics.miss_count += 1
            self._read_misses += 1
        return value, name

    def _weigh_bloom(self) -> None:
        """Whether the Bloom filter should be asked before the lower tiers: it saves a read of
        each of them on a miss and costs its check on a hit, so it pays while the share of
        lookups below memory that miss, times those reads of an absent key, exceeds the check.
        The share is counted over the lookups since the last weighing (at least WEIGH_OVER of
        them). The costs are those of now, not the start-up probe's alone: each weighing times
        again the probe's read in every lower tier (absent there) and a Bloom check of it, and
        smooths them in as the tiers' read costs are (a store grows, a Redis link slows, other
        work pushes the filter out of the CPU's caches). That is one absent read per tier and
        one check per WEIGH_OVER lookups below memory or more; the lookups themselves cannot
        time a miss while the filter answers them. Called on the sampled reads: when the
        filter answers every lookup (all misses) there is none, and it stays first."""
        below = self._rejected + self._reads
        misses = self._rejected + self._read_misses
        seen_below, seen_misses = self._below_seen
        if below - seen_below < WEIGH_OVER or not self._lower:
            return
        self._below_seen = (below, misses)
        probe = self._probe
        for tier in self._lower:
            started = _perf()
            tier.get(probe.text)
            elapsed = _perf() - started
            previous = self._miss_cost.get(tier.name, elapsed)
            self._miss_cost[tier.name] = previous + SMOOTHING * (elapsed - previous)
        started = _perf()
        self.bloom.might_contain(probe.digest)
        elapsed = _perf() - started
        self._bloom_cost += SMOOTHING * (elapsed - self._bloom_cost)
        share = (misses - seen_misses) / (below - seen_below)
        missed = sum(self._miss_cost.get(tier.name, 0.0) for tier in self._lower)
        self._bloom_first = share * missed > self._bloom_cost
        self._gate = self._trust_bloom and self._bloom_first

    def _from_lower(self, key: FeatureKey, cipher: Cipher | None) -> Any | None:
        """The value from the fastest lower tier that has it (single-flight's poll)."""
        faster: list[_Tier] = []
        for tier in self._lower:
            blob = tier.get(key.text)
            if blob is not None:
                value = self._accept(tier, key, cipher, blob, faster)
                if value is not None:
                    return value
            faster.append(tier)
        return None

    def _read_lower_timed(
        self, key: FeatureKey, cipher: Cipher | None
    ) -> tuple[Any | None, str | None]:
        """:meth:`lookup`'s read of the lower tiers with each tier's read timed, and the tiers
        reordered after."""
        faster: list[_Tier] = []
        for tier in self._lower:
            started = _perf()
            blob = tier.get(key.text)
            elapsed = _perf() - started
            self._latency[tier.name].observe(elapsed)
            previous = self._cost.get(tier.name, elapsed)
            self._cost[tier.name] = previous + SMOOTHING * (elapsed - previous)
            if blob is None:
                faster.append(tier)
                continue
            value = self._accept(tier, key, cipher, blob, faster)
            if value is None:
                faster.append(tier)
                continue
            self._order()
            return value, tier.name
        self._order()
        return None, None

    def _accept(
        self, tier: _Tier, key: FeatureKey, cipher: Cipher | None, blob: bytes, faster: list[_Tier]
    ) -> Any | None:
        """Decode a lower tier's bytes and promote them to ``faster`` and memory; None (and
        the entry removed) if they do not decode."""
        try:
            value = decode(cipher.decrypt(blob, key.text.encode()) if cipher else blob, tier.name)
        except Exception as err:  # a corrupt or tampered entry is a miss, and goes
            self._unreadable(tier, key, err)
            return None
        self._hits[tier.name] += 1
        if faster or self.memory is not None:
            self.bloom.add(key.digest, publish=False)  # the promoted copies live a full TTL
            ttl = self._ttl()
            for upper in faster:
                self._write(upper, key, blob, ttl)
            if self.memory is not None:
                self.memory.put(key.digest, value, len(blob), time.monotonic() + ttl)
        return value

    def _into_memory(self, memory: MemoryTier, key: FeatureKey, value: Any, size: int) -> None:
        """A lower tier's hit promoted to memory alone (as :meth:`_accept` promotes it)."""
        self.bloom.add(key.digest, publish=False)  # the promoted copy lives a full TTL
        memory.put(key.digest, value, size, _monotonic() + self._ttl())

    def _unreadable(self, tier: _Tier, key: FeatureKey, err: Exception) -> None:
        """A corrupt or tampered entry: counted, logged, removed (a miss)."""
        self.metrics.corrupt.labels(tier.name).inc()
        logger.warning("%s: dropping unreadable entry %s: %s", tier.name, key.text, err)
        tier.delete(key.text)

    def get_many(self, keys: Sequence[FeatureKey]) -> list[Any | None]:
        """The cached values of several keys, in order (None where missing): memory and the
        Bloom filter key by key, then each lower tier once for every key still missing (Redis in
        one ``MGET`` round trip, the disk in one read transaction)."""
        values: list[Any | None] = [None] * len(keys)
        if not self._enabled:
            return values
        pending: list[tuple[int, FeatureKey, Cipher | None]] = []
        trust_bloom = self._trust_bloom
        for index, key in enumerate(keys):
            cacheable, cipher = self._protection(key)
            if not cacheable:
                continue
            if self.memory is not None:
                value = self.memory.get(key.digest, time.monotonic())
                if value is not None:
                    self._hits["memory"] += 1
                    values[index] = value
                    continue
            if trust_bloom and not self.bloom.might_contain(key.digest):
                self.metrics.bloom_negative_count += 1
                continue
            pending.append((index, key, cipher))
        faster: list[_Tier] = []
        for tier in self._lower:
            if not pending:
                break
            blobs = tier.get_many([key.text for _, key, _ in pending])
            missing = []
            for (index, key, cipher), blob in zip(pending, blobs, strict=True):
                value = None if blob is None else self._accept(tier, key, cipher, blob, faster)
                if value is None:
                    missing.append((index, key, cipher))
                else:
                    values[index] = value
            pending = missing
            faster.append(tier)
        if pending:
            self.metrics.miss_count += len(pending)
        return values
