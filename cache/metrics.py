"""The cache's Prometheus metrics (``hetero_cache_*``, base units, ``tier`` label)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["CacheMetrics"]


class CacheMetrics:
    """Hits, misses, Bloom negatives, single-flight waits, bytes, evictions, errors, latency."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.hits = Counter("hetero_cache_hits_total", "Hits.", ["tier"], registry=r)
        self.misses = Counter("hetero_cache_misses_total", "Misses in every tier.", registry=r)
        self.bloom_negatives = Counter(
            "hetero_cache_bloom_negatives_total", "Misses answered by the Bloom filter.", registry=r
        )
        self.singleflight_waits = Counter(
            "hetero_cache_singleflight_waits_total", "Callers that waited for a leader.", registry=r
        )
        self.computations = Counter(
            "hetero_cache_computations_total", "Values computed on a miss.", registry=r
        )
        self.bytes = Gauge("hetero_cache_bytes", "Bytes held.", ["tier"], registry=r)
        self.evictions = Counter("hetero_cache_evictions_total", "Evictions.", ["tier"], registry=r)
        self.errors = Counter("hetero_cache_errors_total", "Tier failures.", ["tier"], registry=r)
        self.corrupt = Counter(
            "hetero_cache_corrupt_entries_total",
            "Entries that did not decode.",
            ["tier"],
            registry=r,
        )
        self.latency = Histogram(
            "hetero_cache_get_seconds",
            "Time to answer a get from each tier.",
            ["tier"],
            buckets=(1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2),
            registry=r,
        )
