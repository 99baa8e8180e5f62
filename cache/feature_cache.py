"""The feature cache: L1 memory, then local disk and Redis in measured cost order, behind a
Bloom filter, with single-flight and encryption for entries derived from sensitive partitions.

Reads ask the tiers in order of measured cost, not by name: at start-up each lower tier is timed
on a probe value, and every read keeps a moving average per tier, so a slow disk or a fast Redis
reorders them. A hit promotes the entry to the faster tiers; writes go through to every tier;
TTLs carry jitter so entries written together do not expire together.

This module holds the start-up, the writes and erasure; the reads are
:mod:`hetero.cache.feature_reads`, the fields and steps both share
:mod:`hetero.cache.feature_tiers`.
"""

from __future__ import annotations

import functools
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hetero.cache.bloom import GenerationalBloom
from hetero.cache.codec import decode, encode
from hetero.cache.disk_tier import DiskTier
from hetero.cache.feature_reads import FeatureReads
from hetero.cache.feature_tiers import _Tier
from hetero.cache.keys import PREFIX, FeatureKey
from hetero.cache.memory_tier import MemoryTier
from hetero.cache.metrics import CacheMetrics
from hetero.cache.redis_tier import RedisTier
from hetero.cache.singleflight import SingleFlight
from hetero.framework.cipher import Cipher
from hetero.framework.policy.schema import CacheConfig

__all__ = ["FeatureCache"]

logger = logging.getLogger(__name__)

PROBE_READS = 15


def _median_cost(action: Callable[[], Any]) -> float:
    """The median of :data:`PROBE_READS` timings of ``action``, in seconds."""
    samples = []
    for _ in range(PROBE_READS):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


class FeatureCache(FeatureReads):
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

    # --- writes ----------------------------------------------------------------------------

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
