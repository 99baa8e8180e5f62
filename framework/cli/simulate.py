"""``hetero simulate POLICY --workload FILE``: placement policies side by side on one workload."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hetero.framework.fleet import resolve_fleet
from hetero.framework.output import print_json
from hetero.framework.policy import load_policy
from hetero.framework.registry import Registry
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.report import (
    ALIASES,
    compare,
    plot,
    reseeded,
    spread,
    table_rows,
)

COLUMNS = (
    ("mean ms", "mean_ms"),
    ("p50 ms", "p50_ms"),
    ("p99 ms", "p99_ms"),
    ("p99-p50 ms", "p99_minus_p50_ms"),
    ("TTFT p50 ms", "ttft_p50_ms"),
    ("mem std %", "memory_utilisation_std_pct"),
    ("loads", "model_loads"),
    ("evictions", "model_evictions"),
    ("sheds", "shed"),
    ("trips", "breaker_trips"),
    ("low-class max wait s", "lowest_class_max_wait_s"),
    ("req/s", "throughput_rps"),
)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def run_simulate(
    console: Console,
    err: Console,
    registry: Registry,
    policy_path: str,
    workload_path: str,
    names: list[str],
    as_json: bool,
    plot_path: str | None,
    seeds: int = 1,
) -> int:
    """Simulate, print the side-by-side table (or JSON), and draw the plot if asked. With
    ``seeds`` > 1, every policy runs on each of that many seeds (the workload's and the ones
    after it) and the spread over them is reported too."""
    unknown = [name for name in names if name not in ALIASES]
    if unknown or not names:
        err.print(
            f"error: --policies: unknown {', '.join(unknown) or 'empty list'} "
            f"(known: {', '.join(ALIASES)})",
            highlight=False,
            markup=False,
        )
        return 2
    if seeds < 1:
        err.print(f"error: --seeds: must be at least 1, got {seeds}", highlight=False, markup=False)
        return 2
    policy = load_policy(policy_path)
    workload = load_workload(workload_path)
    fleet = resolve_fleet(policy, registry)
    horizon = workload.spec.duration_s
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[now]:.0f} s simulated"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        first = workload.spec.seed
        runs: dict[int, list[dict[str, Any]]] = {}
        for seed in range(first, first + seeds):
            label = f" (seed {seed})" if seeds > 1 else ""
            tasks = {name: bar.add_task(name + label, total=horizon, now=0.0) for name in names}

            def progress(name: str, now: float, tasks: dict[str, Any] = tasks) -> None:
                bar.update(tasks[name], completed=min(now, horizon), now=now)

            results = compare(policy, fleet, reseeded(workload, seed), names, progress)
            runs[seed] = table_rows(results)
            if plot_path and seed == first:
                plot(results, Path(plot_path), f"{workload.spec.name} on {policy.spec.name}")
    rows = runs[first]
    title = f"{workload.spec.name} on {policy.spec.name}"
    if as_json:
        payload: dict[str, Any] = {
            "policy": policy.spec.name,
            "workload": workload.spec.name,
            "results": rows,
        }
        if seeds > 1:
            payload["seeds"] = {str(seed): table for seed, table in runs.items()}
            payload["spread"] = spread(runs)
        print_json(console, payload)
        return 0
    if seeds == 1:
        console.print(_main_table(rows, title))
        console.print(_class_table(rows, title))
        return 0
    console.print(_spread_table(spread(runs), f"{title}, seeds {first}-{first + seeds - 1}"))
    return 0


def _main_table(rows: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("policy")
    for header, _ in COLUMNS:
        table.add_column(header, justify="right")
    for row in rows:
        table.add_row(row["policy"], *(_cell(row[key]) for _, key in COLUMNS))
    return table


def _class_table(rows: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=f"{title}: per QoS class", title_justify="left")
    for header in ("policy", "class", "requests", "mean ms", "p50 ms", "p99 ms", "SLO %"):
        table.add_column(header, justify="left" if header in ("policy", "class") else "right")
    for row in rows:
        for qos, figures in row["classes"].items():
            slo = figures["slo_attainment"]
            table.add_row(
                row["policy"],
                qos,
                str(figures["requests"]),
                _cell(figures["mean_ms"]),
                _cell(figures["p50_ms"]),
                _cell(figures["p99_ms"]),
                _cell(100.0 * slo),
            )
    return table


def _band(stats: dict[str, float] | None, scale: float = 1.0) -> str:
    if stats is None:
        return "-"
    low, high = stats["min"] * scale, stats["max"] * scale
    return f"{_cell(stats['mean'] * scale)} [{_cell(low)}-{_cell(high)}]"


def _spread_table(figures: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=f"{title}: mean over seeds [least-most]", title_justify="left")
    for header in ("policy", "class", "mean ms", "p50 ms", "p99 ms", "SLO %", "best on"):
        table.add_column(header, justify="left" if header in ("policy", "class") else "right")
    for row in figures:
        wins = row["best_on_seeds"]
        table.add_row(
            row["policy"],
            "all",
            _band(row["mean_ms"]),
            _band(row["p50_ms"]),
            _band(row["p99_ms"]),
            "-",
            f"mean {wins['mean_ms']}, p50 {wins['p50_ms']}, p99 {wins['p99_ms']}, "
            f"SLO {wins['slo_min']}",
        )
        for qos, per in row["classes"].items():
            table.add_row(
                "",
                qos,
                _band(per["mean_ms"]),
                _band(per["p50_ms"]),
                _band(per["p99_ms"]),
                _band(per["slo_attainment"], 100.0),
                "",
            )
    return table
