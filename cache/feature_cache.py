"""The feature cache: L1 memory, then local disk and Redis in measured cost order, behind a
Bloom filter, with single-flight and encryption for entries derived from sensitive partitions.

Reads ask the tiers in order of measured cost, not by name: at start-up each lower tier is timed
on a probe value, and every read keeps a moving average per tier, so a slow disk or a fast Redis
reorders them. A hit promotes the entry to the faster tiers; writes go through to every tier;
TTLs carry jitter so entries written together do not expire together.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hetero.cache.bloom import GenerationalBloom
from hetero.cache.codec import decode, decode_from, encode
from hetero.cache.disk_tier import DiskTier
from hetero.cache.keys import PREFIX, FeatureKey
from hetero.cache.memory_tier import MemoryTier
from hetero.cache.metrics import CacheMetrics
from hetero.cache.redis_tier import RedisTier
from hetero.cache.singleflight import SingleFlight
from hetero.framework.cipher import Cipher
from hetero.framework.errors import CacheError
from hetero.framework.policy.schema import CacheConfig

__all__ = ["FeatureCache"]

logger = logging.getLogger(__name__)

PROBE_READS = 15
SMOOTHING = 0.2
SAMPLE_EVERY = 16
WEIGH_OVER = 64  # lookups below memory in one weighing of the Bloom filter's place, at least
_monotonic = time.monotonic
# The clock of the costs timed while serving (the sampled reads, the Bloom check each weighing
# re-times): a module name, so a test can run the weighing on a clock it drives.
_perf = time.perf_counter


def _median_cost(action: Callable[[], Any]) -> float:
    """The median of :data:`PROBE_READS` timings of ``action``, in seconds."""
    samples = []
    for _ in range(PROBE_READS):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


class _Tier(Protocol):
    name: str

    @property
    def up(self) -> bool: ...

    def get(self, key: str) -> bytes | None: ...

    def read(self, key: str) -> tuple[bytes, int] | None: ...

    def get_many(self, keys: list[str]) -> list[bytes | None]: ...

    def delete(self, key: str) -> None: ...


class FeatureCache:
    """Stage outputs by content, shared by workers and hosts.

    Args:
        config: The policy's ``cache`` section.
        sensitive: Partitions whose entries are sensitive.
        cipher_for: The cipher of a sensitive partition (the sandbox's envelope encryption).
        metrics: Where to count (a fresh registry by default).
        directory: Overrides ``config.disk.path`` (tests).
    """

    def __init__(
        self,
        config: CacheConfig,
        *,
        sensitive: frozenset[str] = frozenset(),
        cipher_for: Callable[[str], Cipher | None] | None = None,
        metrics: CacheMetrics | None = None,
        directory: Path | None = None,
    ) -> None:
        self.config = config
        self.sensitive = sensitive
        self._cipher_for = cipher_for or (lambda partition: None)
        self.metrics = metrics or CacheMetrics()
        self.memory = MemoryTier(config.memory.max_bytes) if config.memory.enabled else None
        errors = self.metrics.errors
        self.disk = (
            DiskTier(
                directory or Path(os.path.expanduser(config.disk.path)),
                config.disk.max_bytes,
                on_error=errors.labels("disk").inc,
            )
            if config.disk.enabled
            else None
        )
        self.redis = (
            RedisTier(
                config.redis.url,
                config.redis.timeout_ms / 1000.0,
                on_error=errors.labels("redis").inc,
            )
            if config.redis.enabled
            else None
        )
        rotate = config.ttl_s * (1 + config.ttl_jitter)
        self.bloom = GenerationalBloom(
            config.bloom.expected_entries, config.bloom.false_positive_rate, rotate
        )
        redis_tier = self.redis
        self.single_flight = SingleFlight(
            redis_tier.raw() if redis_tier is not None else None,
            available=(lambda: redis_tier.up) if redis_tier is not None else None,
        )
        self._lower: list[_Tier] = [t for t in (self.disk, self.redis) if t is not None]
        self._cost: dict[str, float] = {}
        # A read of an absent key, per tier, and a Bloom check: timed on the probe at start-up,
        # then again at each weighing of the Bloom filter's place, smoothed (_weigh_bloom).
        self._miss_cost: dict[str, float] = {}
        self._bloom_cost = 0.0
        self._reads = 0
        # Whether the Bloom filter is asked before the lower tiers (_weigh_bloom): lookups that
        # went below memory, and those of them that missed, counted since the last weighing.
        self._bloom_first = True
        self._below_seen = (0, 0)
        self._rejected = 0  # lookup's Bloom negatives
        self._read_misses = 0  # lookup's reads that missed in every lower tier
        # Labelled children bound once: a label lookup per read costs more than the read.
        m = self.metrics
        self._hits = m.hit_counts  # plain counts, read when /metrics is scraped
        self._latency = {name: m.latency.labels(name) for name in ("memory", "disk", "redis")}
        self._plain = not sensitive
        self._enabled = config.enabled
        # Bytes and evictions per tier are read when /metrics is scraped, never tracked by hand.
        if self.memory is not None:
            memory = self.memory
            m.bytes.labels("memory").set_function(lambda: memory.size_bytes)
            m.eviction_sources["memory"] = lambda: memory.evictions
        if self.disk is not None:
            disk = self.disk
            m.bytes.labels("disk").set_function(lambda: disk.size_bytes)
            m.eviction_sources["disk"] = lambda: disk.evictions
        self._measure_tiers()
        if self.redis is not None:  # subscribe first: writes during the warm-up are heard
            self.bloom.share_through(self.redis.raw(), on_erase=self._erased_elsewhere)
        # Filling the Bloom filter reads every key of the disk tier (and Redis): hundreds of
        # thousands on a busy host, seconds of start-up. It runs beside the caller instead;
        # until it is done, a Bloom "no" is not trusted and reads ask the lower tiers.
        self.bloom_warm = threading.Event()
        self._trust_bloom = False  # bloom_warm
        self._gate = False  # _trust_bloom and _bloom_first, read without a call on every lookup
        threading.Thread(target=self._warm_bloom, name="hetero-bloom-warm", daemon=True).start()

    # --- tier order ----------------------------------------------------------------------

    def _measure_tiers(self) -> None:
        probe = FeatureKeyProbe.make()
        self._probe = probe  # absent from every tier after this: _weigh_bloom reads it again
        blob = encode(np.zeros(1280, np.float32))  # a 5 KB embedding
        for tier in self._lower:
            self._write(tier, probe, blob, ttl_s=60.0)
            samples = []
            for _ in range(PROBE_READS):
                started = time.perf_counter()
                tier.get(probe.text)
                samples.append(time.perf_counter() - started)
            tier.delete(probe.text)
            self._cost[tier.name] = statistics.median(samples)
            self._miss_cost[tier.name] = _median_cost(functools.partial(tier.get, probe.text))
        self._bloom_cost = _median_cost(lambda: self.bloom.might_contain(probe.digest))
        self._order()
        logger.info("cache tiers by measured cost: %s", [t.name for t in self._lower])

    def _order(self) -> None:
        # A new list swapped in: readers iterating the old one never see it half-sorted. A tier
        # that is down answers instantly, so it ranks last rather than by that speed.
        self._lower = sorted(
            self._lower,
            key=lambda t: self._cost.get(t.name, float("inf")) if t.up else float("inf"),
        )

    @property
    def bloom_first(self) -> bool:
        """Whether lookups ask the Bloom filter before the lower tiers now (see
        :meth:`_weigh_bloom`); False also while the filter is still warming."""
        return self._gate

    def tier_order(self) -> list[str]:
        """The tiers in the order reads ask them."""
        return (["memory"] if self.memory is not None else []) + [t.name for t in self._lower]

    def _warm_bloom(self) -> None:
        try:
            self._fill_bloom()
        except Exception as err:  # a tier that fails here fails reads too; never trust the filter
            logger.warning("feature cache: Bloom filter not warmed (%s); it stays bypassed", err)
            return
        self._trust_bloom = True
        self._gate = self._bloom_first
        self.bloom_warm.set()

    def _fill_bloom(self) -> None:
        limit = self.config.bloom.expected_entries
        keys: list[Any] = []
        if self.disk is not None:
            keys += self.disk.keys()[:limit]
        if self.redis is not None:
            keys += self.redis.scan_keys(f"{PREFIX}:*", limit)
        digests = []
        for key in keys:
            text = key.decode() if isinstance(key, bytes) else str(key)
            try:
                digests.append(bytes.fromhex(text.rsplit(":", 1)[1]))
            except (ValueError, IndexError):
                continue
        self.bloom.add_many(digests)

    # --- sensitive entries ---------------------------------------------------------------

    def _protection(self, key: FeatureKey) -> tuple[bool, Cipher | None]:
        """(cacheable, cipher) for the key's partition."""
        if self._plain or key.partition is None or key.partition not in self.sensitive:
            return True, None
        if self.config.sensitive == "skip":
            return False, None
        cipher = self._cipher_for(key.partition)
        if cipher is None:
            raise CacheError(
                f"partition {key.partition!r} is sensitive and the policy says encrypt, "
                "but no cipher is available for it"
            )
        return True, cipher

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

    # --- writes ----------------------------------------------------------------------------

    def _ttl(self) -> float:
        return self.config.ttl_s * (1 + random.uniform(0, self.config.ttl_jitter))

    def _write(self, tier: _Tier, key: FeatureKey, blob: bytes, ttl_s: float) -> None:
        if isinstance(tier, DiskTier):
            tier.put(key.text, blob, ttl_s, key.content)
        elif isinstance(tier, RedisTier):
            if key.stage == "probe":  # the start-up probe needs no erasure index
                tier.guarded(lambda: tier.raw().set(key.text, blob, px=int(ttl_s * 1000)), None)
            else:
                tier.put(key.text, blob, ttl_s, key.content, key.partition)

    def put(self, key: FeatureKey, value: Any) -> None:
        """Store ``value`` in every tier (encrypted for a sensitive partition). The memory tier
        keeps a decoded, read-only copy, so later changes to ``value`` do not leak in."""
        if not self._enabled:
            return
        cacheable, cipher = self._protection(key)
        if not cacheable:
            return
        plain = encode(value)
        blob = cipher.encrypt(plain, key.text.encode()) if cipher is not None else plain
        ttl = self._ttl()
        if self.memory is not None:
            value = decode(plain, verified=True)  # encoded just now: no checksum to verify
            self.memory.put(key.digest, value, len(blob), time.monotonic() + ttl)
        for tier in self._lower:
            self._write(tier, key, blob, ttl)
        self.bloom.add(key.digest)

    def get_or_compute(self, key: FeatureKey, compute: Callable[[], Any]) -> Any:
        """The cached value, or ``compute()`` once however many callers miss together."""
        value = self.get(key)
        if value is not None:
            return value
        if not self._enabled or not self._protection(key)[0]:
            self.metrics.computations.inc()
            return compute()
        waits_before = self.single_flight.waits

        def computed() -> Any:
            self.metrics.computations.inc()
            return compute()

        result = self.single_flight.run(
            key.text,
            computed,
            lambda: self._from_lower(key, self._protection(key)[1]),
            lambda v: self.put(key, v),
            sensitive=key.partition is not None and key.partition in self.sensitive,
        )
        self.metrics.singleflight_waits.inc(self.single_flight.waits - waits_before)
        return result

    # --- erasure ---------------------------------------------------------------------------

    def erase_content(self, content: str) -> int:
        """Remove every entry derived from one piece of content from every tier, here and (with
        Redis) in every other instance, which hears it on a channel and erases its own memory
        and disk. Raises if a tier here cannot be erased: erasure is never reported done when it
        was not."""
        removed = self._erase_local(content=content)
        if self.redis is not None:
            removed += self.redis.erase_content(content)
            self.bloom.announce_erase(f"c:{content}")
        return removed

    def erase_partition(self, partition: str) -> int:
        """Remove every entry of one partition from every tier (as :meth:`erase_content`)."""
        removed = self._erase_local(partition=partition)
        if self.redis is not None:
            removed += self.redis.erase_partition(partition)
            self.bloom.announce_erase(f"p:{partition}")
        return removed

    def _erase_local(self, *, content: str | None = None, partition: str | None = None) -> int:
        if self.memory is not None:
            self.memory.clear()  # digests do not say their content; L1 refills from below
        if self.disk is None:
            return 0
        if content is not None:
            return self.disk.erase_content(content)
        return self.disk.erase_prefix(f"{PREFIX}:{partition}:")

    def _erased_elsewhere(self, what: str) -> None:
        kind, _, name = what.partition(":")
        try:
            if kind == "c":
                self._erase_local(content=name)
            elif kind == "p":
                self._erase_local(partition=name)
        except Exception as err:
            logger.error("erasure of %s announced by another instance failed here: %s", what, err)

    def close(self) -> None:
        """Stop the Bloom subscriber, close the disk index."""
        self.bloom.close()
        if self.disk is not None:
            self.disk.close()


class FeatureKeyProbe:
    """The key of the start-up timing probe."""

    @staticmethod
    def make() -> FeatureKey:
        digest = os.urandom(32)
        return FeatureKey(digest=digest, content="probe", stage="probe", partition="probe")
