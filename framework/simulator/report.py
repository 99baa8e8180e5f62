"""Running several placement policies on one workload, side by side, and drawing the plots."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hetero.framework.fleet import Fleet
from hetero.framework.policy import Policy
from hetero.framework.simulator.metrics import RunMetrics
from hetero.framework.simulator.run import simulate
from hetero.framework.simulator.workload import Workload

__all__ = ["ALIASES", "compare", "plot"]

# Names users type, and the (placement, eviction) each stands for. "lru" is the cost model with
# plain least-recently-used eviction and no minimum residency (the thrash scenario's baseline);
# "predictive" is hetero with the forecast-driven warm-up on (scheduler.warmup), whatever the
# policy's ``enabled`` says.
ALIASES = {
    "hetero": ("cost_model", "cost_aware"),
    "cost_model": ("cost_model", "cost_aware"),
    "round_robin": ("round_robin", "cost_aware"),
    "least_connections": ("least_connections", "cost_aware"),
    "lru": ("cost_model", "lru"),
    "predictive": ("cost_model", "predictive"),
}


def compare(
    policy: Policy,
    fleet: Fleet,
    workload: Workload,
    names: Sequence[str],
    progress: Callable[[str, float], None] | None = None,
) -> list[RunMetrics]:
    """Every named policy on the identical arrival sequence (the workload's seed)."""
    unknown = [n for n in names if n not in ALIASES]
    if unknown:
        raise ValueError(f"unknown policies {unknown} (known: {', '.join(ALIASES)})")
    topology = fleet.topology()
    results = []
    for name in names:
        placement, eviction = ALIASES[name]

        def tick(now: float, label: str = name) -> None:
            if progress is not None:
                progress(label, now)

        metrics = simulate(
            policy,
            fleet.devices,
            topology,
            workload,
            placement=placement,
            eviction=eviction,
            progress=tick,
        )
        metrics.policy = name
        results.append(metrics)
    return results


def plot(results: Sequence[RunMetrics], path: Path, title: str) -> None:
    """Latency CDFs per policy and a per-device busy timeline of the first policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figure, (cdf, timeline) = plt.subplots(1, 2, figsize=(14, 5))
    for metrics in results:
        values = np.sort(np.asarray(metrics.latencies)) * 1e3
        if values.size:
            cdf.plot(values, np.arange(1, values.size + 1) / values.size, label=metrics.policy)
    cdf.set_xlabel("end-to-end latency (ms)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_title("Latency CDF")
    cdf.grid(alpha=0.3)
    cdf.legend()
    first = results[0]
    devices = sorted(first.busy)
    for row, device in enumerate(devices):
        timeline.broken_barh(first.busy[device], (row - 0.4, 0.8))
    timeline.set_yticks(range(len(devices)), devices)
    timeline.set_xlabel("simulated time (s)")
    timeline.set_title(f"Device busy timeline ({first.policy})")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def table_rows(results: Sequence[RunMetrics]) -> list[dict[str, Any]]:
    """Each policy's summary."""
    return [metrics.summary() for metrics in results]
