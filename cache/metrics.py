"""The cache's Prometheus metrics (``hetero_cache_*``, base units, ``tier`` label).

The counters on the read path (hits, misses, Bloom negatives, evictions) are plain integers,
bumped in place and read when the registry is collected (a scrape): a prometheus-client
``Counter.inc`` takes a lock and costs more than an L1 hit. Evictions are the tiers' own counts,
read from the tiers. An integer attribute or item bumped by ``+= 1`` with no Python code in
between cannot interleave with another thread's under CPython's GIL (the interpreter switches
threads only at calls and backward jumps). The rest, off the read path, stay prometheus-client
metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["TIERS", "CacheMetrics"]

TIERS = ("memory", "disk", "redis")


class CacheMetrics:
    """Hits, misses, Bloom negatives, single-flight waits, bytes, evictions, errors, latency.

    Attributes:
        hit_counts: Hits by tier name (bumped in place, read at scrape time).
        miss_count: Reads that missed in every tier.
        bloom_negative_count: Misses answered by the Bloom filter.
        eviction_sources: A function per tier giving its evictions so far.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.hit_counts: dict[str, int] = dict.fromkeys(TIERS, 0)
        self.miss_count = 0
        self.bloom_negative_count = 0
        self.eviction_sources: dict[str, Callable[[], int]] = {}
        r.register(_ReadPathCollector(self))
        self.singleflight_waits = Counter(
            "hetero_cache_singleflight_waits_total", "Callers that waited for a leader.", registry=r
        )
        self.computations = Counter(
            "hetero_cache_computations_total", "Values computed on a miss.", registry=r
        )
        self.bytes = Gauge("hetero_cache_bytes", "Bytes held.", ["tier"], registry=r)
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


class _ReadPathCollector(Collector):
    """The read path's plain counters as Prometheus counter families, read at each collect."""

    def __init__(self, metrics: CacheMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        hits = CounterMetricFamily("hetero_cache_hits", "Hits.", labels=["tier"])
        for tier, count in m.hit_counts.items():
            hits.add_metric([tier], count)
        yield hits
        yield CounterMetricFamily(
            "hetero_cache_misses", "Misses in every tier.", value=m.miss_count
        )
        yield CounterMetricFamily(
            "hetero_cache_bloom_negatives",
            "Misses answered by the Bloom filter.",
            value=m.bloom_negative_count,
        )
        evictions = CounterMetricFamily("hetero_cache_evictions", "Evictions.", labels=["tier"])
        for tier, source in m.eviction_sources.items():
            evictions.add_metric([tier], source())
        yield evictions
