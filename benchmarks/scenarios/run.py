"""Run the shipped scenarios: ``python benchmarks/scenarios/run.py [NAME ...]``.

Each scenario folder holds ``scenario.yaml`` (policy, workload, policies to compare). Results go
to ``results/scenarios/<name>/``: ``results.json``, ``table.md`` and ``plot.png``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import load_policy
from hetero.framework.registry import Registry
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.report import compare, plot, table_rows

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "results" / "scenarios"
SCENARIOS = ("ref-8xa100", "thrash", "mixed-fleet", "azure-conv", "warmup", "multimodal")
COLUMNS = (
    "mean_ms",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "p99_minus_p50_ms",
    "ttft_p50_ms",
    "memory_utilisation_std_pct",
    "memory_utilisation_mean_pct",
    "kv_block_waste_pct",
    "load_waits",
    "model_loads",
    "loads_per_hour",
    "model_evictions",
    "shed",
    "breaker_trips",
    "kv_preemptions",
    "lowest_class_max_wait_s",
    "throughput_rps",
    "completed",
    "wall_s",
)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def markdown(name: str, rows: list[dict[str, Any]]) -> str:
    """A table with one column per policy."""
    lines = [f"### {name}", "", "| figure | " + " | ".join(r["policy"] for r in rows) + " |"]
    lines.append("|---|" + "---|" * len(rows))
    for column in COLUMNS:
        lines.append(f"| {column} | " + " | ".join(_fmt(r[column]) for r in rows) + " |")
    attainment = " | ".join(
        ", ".join(f"{q} {v:.3f}" for q, v in r["slo_attainment"].items() if v is not None)
        for r in rows
    )
    lines.append(f"| slo_attainment | {attainment} |")
    return "\n".join(lines) + "\n"


def run(name: str) -> dict[str, Any]:
    """One scenario: simulate, write the files, return the rows."""
    folder = HERE / name
    config = yaml.safe_load((folder / "scenario.yaml").read_text())
    policy = load_policy(folder / config["policy"])
    workload = load_workload(folder / config["workload"])
    fleet = resolve_fleet(policy, Registry(use_entry_points=False))
    started = time.perf_counter()
    results = compare(policy, fleet, workload, config["policies"])
    wall = time.perf_counter() - started
    rows = table_rows(results)
    out = RESULTS / name
    out.mkdir(parents=True, exist_ok=True)
    plot(results, out / "plot.png", f"{name}: {workload.spec.name} on {policy.spec.name}")
    payload = {"scenario": name, "wall_s_all_policies": wall, "results": rows}
    (out / "results.json").write_text(json.dumps(payload, indent=1))
    text = markdown(name, rows) + f"\nAll policies simulated in {wall:.1f} s of wall time.\n"
    (out / "table.md").write_text(text)
    print(text)
    return payload


def main(names: list[str]) -> None:
    """Run the named scenarios (all four by default)."""
    for name in names or SCENARIOS:
        run(name)
    print(f"results under {RESULTS}")


if __name__ == "__main__":
    main(sys.argv[1:])
