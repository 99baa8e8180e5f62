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
from hetero.framework.simulator.report import ALIASES, compare, plot, table_rows

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
) -> int:
    """Simulate, print the side-by-side table (or JSON), and draw the plot if asked."""
    unknown = [name for name in names if name not in ALIASES]
    if unknown or not names:
        err.print(
            f"error: --policies: unknown {', '.join(unknown) or 'empty list'} "
            f"(known: {', '.join(ALIASES)})",
            highlight=False,
            markup=False,
        )
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
        tasks = {name: bar.add_task(name, total=horizon, now=0.0) for name in names}

        def progress(name: str, now: float) -> None:
            bar.update(tasks[name], completed=min(now, horizon), now=now)

        results = compare(policy, fleet, workload, names, progress)
    rows = table_rows(results)
    if plot_path:
        plot(results, Path(plot_path), f"{workload.spec.name} on {policy.spec.name}")
    if as_json:
        print_json(
            console, {"policy": policy.spec.name, "workload": workload.spec.name, "results": rows}
        )
        return 0
    table = Table(title=f"{workload.spec.name} on {policy.spec.name}", title_justify="left")
    table.add_column("policy")
    for header, _ in COLUMNS:
        table.add_column(header, justify="right")
    for row in rows:
        table.add_row(row["policy"], *(_cell(row[key]) for _, key in COLUMNS))
    console.print(table)
    return 0
