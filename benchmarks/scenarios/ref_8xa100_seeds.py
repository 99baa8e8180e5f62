"""ref-8xa100 on other seeds: how far one seed's figures speak for the placement.

``python benchmarks/scenarios/ref_8xa100_seeds.py [--seeds 1,2,...,7] [--policies ...]`` runs
the scenario's workload with each seed in place of its own (7), every placement on each seed's
identical arrivals, and prints per seed the mean, p50, p99, p99 - p50 and memory-use std dev of
each placement and hetero's ratios to round robin, then the ratios' spread over the seeds and how
much of hetero's p99 - p50 against round robin's comes from its p50 and how much from its p99.

The closed loop feeds every completion back into the next arrival, so a small change in one
decision (a correction's last digits) moves every later one: a single seed's ratio is one draw
of a chaotic system. docs/simulator.md gives the figures.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import load_policy
from hetero.framework.registry import Registry
from hetero.framework.simulator import Workload, load_workload
from hetero.framework.simulator.report import compare

HERE = Path(__file__).resolve().parent / "ref-8xa100"
FIGURES = ("mean_ms", "p50_ms", "p99_ms", "p99_minus_p50_ms", "memory_utilisation_std_pct")


def sweep(seeds: list[int], policies: list[str]) -> list[dict[str, dict[str, float]]]:
    """Per seed, each placement's figures (:data:`FIGURES`)."""
    policy = load_policy(HERE / ".." / ".." / ".." / "policies" / "sim" / "8xa100.yaml")
    workload = load_workload(HERE / "workload.yaml")
    fleet = resolve_fleet(policy, Registry(use_entry_points=False))
    rows = []
    for seed in seeds:
        seeded = Workload(workload.spec.model_copy(update={"seed": seed}), workload.source)
        results = compare(policy, fleet, seeded, policies)
        rows.append({m.policy: {f: float(m.summary()[f]) for f in FIGURES} for m in results})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1,2,3,4,5,6,7")
    parser.add_argument("--policies", default="hetero,round_robin,least_connections")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    policies = args.policies.split(",")
    rows = sweep(seeds, policies)
    ratios: dict[str, list[float]] = {f: [] for f in FIGURES}
    for seed, row in zip(seeds, rows, strict=True):
        cells = []
        for name in policies:
            fig = row[name]
            cells.append(
                f"{name} {fig['mean_ms']:.0f} / {fig['p50_ms']:.0f} / {fig['p99_ms']:.0f} / "
                f"{fig['p99_minus_p50_ms']:.1f} / {fig['memory_utilisation_std_pct']:.4f}"
            )
        line = f"seed {seed}: " + "; ".join(cells)
        if "hetero" in row and "round_robin" in row:
            for figure in FIGURES:
                ratios[figure].append(row["hetero"][figure] / row["round_robin"][figure])
            line += " | hetero/RR " + " ".join(f"{ratios[f][-1]:.3f}" for f in FIGURES)
        print(line)
    print("(mean ms / p50 ms / p99 ms / p99 - p50 ms / memory std %)")
    for figure, values in ratios.items():
        if values:
            print(
                f"hetero/RR {figure}: min {min(values):.3f} median "
                f"{statistics.median(values):.3f} max {max(values):.3f}"
            )
    if ratios["mean_ms"]:
        _print_spread_sources(rows)


def _print_spread_sources(rows: list[dict[str, dict[str, float]]]) -> None:
    """hetero's p99 - p50 less round robin's, over the seeds, split into its p99's part and its
    p50's: a smaller spread from a lower p99 is a shorter tail, from a higher p50 a slower
    median."""
    p50 = statistics.fmean(r["hetero"]["p50_ms"] - r["round_robin"]["p50_ms"] for r in rows)
    p99 = statistics.fmean(r["hetero"]["p99_ms"] - r["round_robin"]["p99_ms"] for r in rows)
    print(
        f"hetero - RR, mean over the seeds: p99 {p99:+.1f} ms, p50 {p50:+.1f} ms, "
        f"p99 - p50 {p99 - p50:+.1f} ms ({-p50 / (p99 - p50):.0%} of it from the p50)"
        if p99 != p50
        else f"hetero - RR, mean over the seeds: p99 and p50 {p99:+.1f} ms"
    )


if __name__ == "__main__":
    main()
