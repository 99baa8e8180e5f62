"""The engine's counters and histograms (Prometheus naming: ``hetero_`` prefix, base units,
``_total`` counters, low-cardinality labels). Each engine owns its registry; the server exposes
it at ``/metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["EngineMetrics"]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class EngineMetrics:
    """Everything the engine measures."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "hetero_requests_total", "Requests by outcome.", ["route", "outcome"], registry=r
        )
        self.sheds = Counter(
            "hetero_requests_shed_total", "Requests refused by admission.", ["reason"], registry=r
        )
        self.degraded = Counter(
            "hetero_requests_degraded_total", "Requests run on light variants.", registry=r
        )
        self.queue_wait = Histogram(
            "hetero_queue_wait_seconds",
            "Time a stage task waited before its batch ran.",
            ["stage", "qos"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_latency = Histogram(
            "hetero_stage_latency_seconds",
            "Run time of a batch.",
            ["stage", "device_class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "hetero_batch_size", "Items per batch.", ["stage"], buckets=BATCH_BUCKETS, registry=r
        )
        self.device_busy = Counter(
            "hetero_device_busy_seconds_total", "Time spent running.", ["device"], registry=r
        )
        self.loads = Counter("hetero_model_loads_total", "Model loads.", ["device"], registry=r)
        self.evictions = Counter(
            "hetero_model_evictions_total", "Model evictions.", ["device"], registry=r
        )
        self.failures = Counter(
            "hetero_stage_failures_total",
            "Failed runs (retried elsewhere).",
            ["stage", "device"],
            registry=r,
        )
        self.retries = Counter(
            "hetero_stage_retries_total", "Tasks retried.", ["stage"], registry=r
        )
        self.breaker_state = Gauge(
            "hetero_breaker_open",
            "1 while the (stage, device) breaker is not closed.",
            ["stage", "device"],
            registry=r,
        )
