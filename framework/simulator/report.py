"""Running several placement policies on one workload, side by side, and drawing the plots."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hetero.framework.fleet import Fleet
from hetero.framework.policy import Policy
from hetero.framework.simulator.metrics import RunMetrics
from hetero.framework.simulator.run import simulate
from hetero.framework.simulator.workload import Workload

__all__ = ["ALIASES", "SPREAD_FIGURES", "compare", "plot", "reseeded", "spread", "sweep"]

# Names users type, and the (placement, eviction) each stands for. "lru" is the cost model with
# plain least-recently-used eviction and no minimum residency (the thrash scenario's baseline);
# "predictive" is hetero with the forecast-driven warm-up on (scheduler.warmup), whatever the
# policy's ``enabled`` says. "power_of_two": of two devices drawn at random, the one with fewer
# tasks in flight; "pinned_fastest": each stage on the kind of device fastest for one item of it
# (the policy's figures), shared among those devices by least connections.
ALIASES = {
    "hetero": ("cost_model", "cost_aware"),
    "cost_model": ("cost_model", "cost_aware"),
    "round_robin": ("round_robin", "cost_aware"),
    "least_connections": ("least_connections", "cost_aware"),
    "power_of_two": ("power_of_two", "cost_aware"),
    "pinned_fastest": ("pinned_fastest", "cost_aware"),
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


def reseeded(workload: Workload, seed: int) -> Workload:
    """``workload`` with another seed: other draws (arrivals, request kinds, load times)."""
    return dataclasses.replace(workload, spec=workload.spec.model_copy(update={"seed": seed}))


def sweep(
    policy: Policy,
    fleet: Fleet,
    workload: Workload,
    names: Sequence[str],
    seeds: Sequence[int],
    progress: Callable[[str, float], None] | None = None,
) -> dict[int, list[dict[str, Any]]]:
    """:func:`compare` once per seed (every policy on each seed's identical arrivals): each
    seed's summaries, in the order of ``names``."""
    return {
        seed: table_rows(compare(policy, fleet, reseeded(workload, seed), names, progress))
        for seed in seeds
    }


# The figures :func:`spread` summarises over seeds (besides SLO attainment per class).
SPREAD_FIGURES = ("mean_ms", "p50_ms", "p99_ms", "throughput_rps")


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def spread(runs: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per policy, each figure's mean, least, greatest and standard deviation over the seeds,
    overall and per QoS class (mean, p50, p99, SLO attainment), and on how many seeds the
    policy had the best value of each overall figure (ties count for each; for SLO, the
    lowest class attainment, higher is better; for the rest, lower is better)."""
    seeds = sorted(runs)
    names = [row["policy"] for row in runs[seeds[0]]]
    out = []
    for position, name in enumerate(names):
        rows = [runs[seed][position] for seed in seeds]
        figures: dict[str, Any] = {"policy": name, "seeds": seeds}
        for key in SPREAD_FIGURES:
            values = [row[key] for row in rows if row[key] is not None]
            figures[key] = _stats(values) if values else None
        classes: dict[str, dict[str, Any]] = {}
        for qos in sorted({q for row in rows for q in row["classes"]}):
            per = [row["classes"][qos] for row in rows if qos in row["classes"]]
            classes[qos] = {
                key: _stats(values) if values else None
                for key in ("mean_ms", "p50_ms", "p99_ms", "slo_attainment")
                for values in [[p[key] for p in per if p[key] is not None]]
            }
        figures["classes"] = classes
        wins = dict.fromkeys((*SPREAD_FIGURES[:3], "slo_min"), 0)
        for seed in seeds:
            table = runs[seed]
            for key in SPREAD_FIGURES[:3]:
                values = [row[key] for row in table if row[key] is not None]
                mine = table[position][key]
                if values and mine is not None and mine <= min(values):
                    wins[key] += 1
            lowest = [min(row["slo_attainment"].values(), default=0.0) for row in table]
            if lowest[position] >= max(lowest):
                wins["slo_min"] += 1
        figures["best_on_seeds"] = wins
        out.append(figures)
    return out


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
