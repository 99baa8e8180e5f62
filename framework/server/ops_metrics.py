"""Metrics a dashboard needs beyond the engine's own, read when ``/metrics`` is scraped:

- ``hetero_cache_tier_*``: the feature cache's per-tier counters (hits by tier, bytes, get
  latency...), which it keeps in a registry of its own, re-exported under a name of their own
  (``hetero_cache_hits_total`` here is already the serving layer's count per stage).
- ``hetero_sandbox_workers{state="up"|"down"}``: partition sandboxes whose device is healthy
  or not (both 0 on a policy without partitions).
- ``hetero_device_actor_restarts_total{device}``: in the Ray mode, how often a device's actor
  died and came back warm; ``hetero_cluster_reachable``: 1 while the cluster's head answers
  (absent in the embedded mode).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "CacheTierCollector",
    "ClusterCollector",
    "SandboxHealthCollector",
    "cluster_unreachable",
]

SANDBOX_BACKEND = "sandbox"  # hetero.sandbox.device.SANDBOX_BACKEND


class CacheTierCollector(Collector):
    """The feature cache's ``hetero_cache_*`` families as ``hetero_cache_tier_*``."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            name = family.name.replace("hetero_cache_", "hetero_cache_tier_", 1)
            renamed = Metric(name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                renamed.add_sample(
                    sample.name.replace("hetero_cache_", "hetero_cache_tier_", 1),
                    sample.labels,
                    sample.value,
                    sample.timestamp,
                    sample.exemplar,
                )
            yield renamed


class SandboxHealthCollector(Collector):
    """How many partition sandboxes are up and down, asked of the engine at each scrape."""

    def __init__(self, engine: Callable[[], Any]) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "hetero_sandbox_workers", "Partition sandboxes by health.", labels=["state"]
        )
        up = down = 0
        engine = self.engine()
        if engine is not None:
            backend = engine.backends.get(SANDBOX_BACKEND)
            for device in engine.fleet.devices:
                if device.backend != SANDBOX_BACKEND or backend is None:
                    continue
                if backend.health(device.id) is None:
                    up += 1
                else:
                    down += 1
        family.add_metric(["up"], up)
        family.add_metric(["down"], down)
        yield family


def _cluster_backends(engine: Any) -> list[Any]:
    """The engine's backends over a cluster (those that say whether it is reachable)."""
    if engine is None:
        return []
    return [b for b in engine.backends.values() if callable(getattr(b, "unreachable", None))]


def cluster_unreachable(engine: Any) -> str | None:
    """Why the engine's cluster is out of reach (its head lost), or None (also in the
    embedded mode): ``/ready`` answers 503 with it."""
    for backend in _cluster_backends(engine):
        reason = backend.unreachable()
        if reason is not None:
            return str(reason)
    return None


class ClusterCollector(Collector):
    """The Ray mode's device actor restarts and whether the cluster's head answers."""

    def __init__(self, engine: Callable[[], Any]) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        backends = _cluster_backends(self.engine())
        if not backends:
            return
        restarts = CounterMetricFamily(
            "hetero_device_actor_restarts",
            "Times a device's actor on a cluster node died and came back warm.",
            labels=["device"],
        )
        reachable = GaugeMetricFamily(
            "hetero_cluster_reachable", "1 while the cluster's head (Ray's GCS) answers."
        )
        for backend in backends:
            for device, count in sorted(backend.actor_restarts().items()):
                restarts.add_metric([device], count)
        reachable.add_metric([], 0 if cluster_unreachable(self.engine()) else 1)
        yield restarts
        yield reachable
