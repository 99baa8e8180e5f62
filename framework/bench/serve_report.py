"""Printing ``hetero bench serve``: one table of every stack and concurrency, then the ratios
and goals, or the whole report as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from hetero.framework.bench.serve import DEFAULT_CONCURRENCY, run_serve_bench
from hetero.framework.bench.serve_placement import RUNTIMES, run_placement_bench
from hetero.framework.output import print_json

__all__ = [
    "parse_concurrency",
    "print_placement_report",
    "print_report",
    "run_bench_placement",
    "run_bench_serve",
]


def parse_concurrency(text: str) -> tuple[int, ...]:
    """``"1,8,32"`` -> (1, 8, 32); ValueError for anything else."""
    values = tuple(int(part) for part in text.split(",") if part.strip())
    if not values or any(v < 1 for v in values):
        raise ValueError(f"--concurrency: expected positive integers like 1,8,32, got {text!r}")
    return values


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _rows(name: str, mode: str, points: dict[str, Any]) -> list[list[str]]:
    rows = []
    for conc, p in points.items():
        embed, vision = p["routes"]["embed"], p["routes"]["vision"]
        rows.append(
            [
                name,
                mode,
                conc,
                f"{p['req_s']:.1f}",
                f"{_ms(p['p50_ms'])} / {_ms(p['p99_ms'])}",
                f"{embed['req_s']:.1f}: {_ms(embed['p50_ms'])} / {_ms(embed['p99_ms'])}",
                f"{vision['req_s']:.1f}: {_ms(vision['p50_ms'])} / {_ms(vision['p99_ms'])}",
                str(p["errors"]),
            ]
        )
    return rows


def print_report(console: Console, result: dict[str, Any]) -> None:
    """The table, memory and start-up, ratios and goals."""
    table = Table(
        title=(
            f"Serving, 70 % /embed + 30 % /vision, closed loop, {result['seconds']:g} s per point"
            f", median of {result.get('rounds', 1)} interleaved rounds (the in-process loop:"
            f" one run, alone)"
            f" (ORT spin-waiting off, {result['cpus']} CPUs)"
        ),
        title_justify="left",
    )
    for column in ("stack", "content", "conc", "req/s", "p50 / p99 ms", "embed", "vision", "err"):
        table.add_column(column, justify="left" if column in ("stack", "content") else "right")
    stacks = result["stacks"]
    for row in _rows("in-process loop", "unique", stacks["inprocess"]["points"]):
        table.add_row(*row)
    names = {
        "fastapi": "FastAPI",
        "hetero": "hetero (cache off)",
        "hetero_cache": "hetero (cache on)",
        "hetero_free": "hetero (unpinned)",
    }
    labels = {"points": "unique", "repeated": "30% repeated"}
    for key, name in names.items():
        for mode, label in labels.items():
            if key in stacks and mode in stacks[key]:
                for row in _rows(name, label, stacks[key][mode]):
                    table.add_row(*row)
    console.print(table)
    console.print("embed / vision columns: req/s: p50 / p99 ms", highlight=False)
    for key, name in names.items():
        s = stacks.get(key)
        if s is None:
            continue
        console.print(
            f"{name}: start-up {s['startup_s']:.2f} s, idle RSS {s['idle_rss_mb']:.0f} MB, "
            f"after load {s['rss_after_load_mb']:.0f} MB",
            highlight=False,
        )
        if "isolation" not in s:
            continue
        iso = s["isolation"]
        console.print(
            f"{name}: embed alone p50/p99 {_ms(iso['embed_alone']['p50_ms'])} / "
            f"{_ms(iso['embed_alone']['p99_ms'])} ms; with {iso['heavy_clients']} clients on "
            f"/vision {_ms(iso['embed_under_load']['p50_ms'])} / "
            f"{_ms(iso['embed_under_load']['p99_ms'])} ms "
            f"(vision {iso['vision_under_load']['req_s']} req/s)",
            highlight=False,
        )
    overhead = result["engine_overhead_us"]
    console.print(
        f"engine per request, no model: p50 {overhead['p50_us']} us, p99 {overhead['p99_us']} us;"
        f" each further stage of a graph {overhead['further_stage_us']} us",
        highlight=False,
    )
    load = result.get("load_average")
    if load:
        console.print(f"load average (1, 5, 15 min) at the end: {load}", highlight=False)
    for name, goal in result["goals"].items():
        met = {True: "met", False: "missed", None: "n/a"}[goal["met"]]
        console.print(f"{name}: {goal['value']} (goal {goal['goal']}): {met}", highlight=False)


def run_bench_serve(
    console: Console,
    as_json: bool,
    seconds: float = 5.0,
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
    rounds: int = 1,
) -> int:
    """Run the serving bench and print it (progress on stderr)."""
    err = Console(stderr=True)
    result = run_serve_bench(
        seconds,
        concurrency,
        rounds=rounds,
        progress=lambda message: err.print(message, highlight=False),
    )
    if as_json:
        print_json(console, result)
    else:
        print_report(console, result)
    return 0


def _route_cell(figures: dict[str, Any] | None) -> str:
    if not figures or not figures["requests"]:
        return "-"
    return f"{figures['req_s']:.1f}: {_ms(figures['p50_ms'])} / {_ms(figures['p99_ms'])}"


def print_placement_report(console: Console, result: dict[str, Any]) -> None:
    """``--placement``: every stack's points, start-up and memory, where each stage ran and
    why warm-up left a runtime idle, then the ratios and goals."""
    stacks = result["stacks"]
    routes = sorted(
        {
            route
            for stack in stacks.values()
            for point in stack.get("points", {}).values()
            for route, figures in point["routes"].items()
            if figures["requests"]
        }
    )
    table = Table(
        title=(
            f"Placement, {result.get('load', 'two')} load, closed loop, {result['seconds']:g} s"
            f" per point, median of {result['rounds']} interleaved rounds, {result['cpus']} CPUs"
            f" (policy {result['policy']}, cache off)"
        ),
        title_justify="left",
    )
    for column in ("stack", "conc", "req/s", "rounds", "p50 / p99 ms", *routes, "err"):
        table.add_column(column, justify="left" if column == "stack" else "right")
    for name, stack in stacks.items():
        for conc, p in stack.get("points", {}).items():
            cells = [_route_cell(p["routes"].get(r)) for r in routes]
            rounds = " ".join(f"{x:.0f}" for x in p.get("rounds_req_s", []))
            table.add_row(
                name,
                conc,
                f"{p['req_s']:.1f}",
                rounds,
                f"{_ms(p['p50_ms'])} / {_ms(p['p99_ms'])}",
                *cells,
                str(p["errors"]),
            )
    console.print(table)
    console.print("route columns: req/s: p50 / p99 ms; rounds: each round's req/s", highlight=False)
    for name, stack in stacks.items():
        console.print(
            f"{name}: start-up {stack['startup_s']:.2f} s, idle RSS {stack['idle_rss_mb']:.0f} MB,"
            f" assignment {stack['assignment']}",
            highlight=False,
        )
        for stage in stack.get("stages", []):
            ran = ", ".join(f"{d} {n}" for d, n in sorted(stage.get("placements", {}).items()))
            console.print(
                f"  {stage['stage']}: ran on {ran or 'nothing measured'}; resident on "
                f"{stage.get('resident_on')}",
                highlight=False,
            )
            for device, why in stage.get("idle_devices", {}).items():
                console.print(f"    {device} idle: {why}", highlight=False)
        for conc, placed in stack.get("placed_per_concurrency", {}).items():
            where = "; ".join(
                f"{stage} " + ", ".join(f"{d} {n}" for d, n in sorted(devices.items()))
                for stage, devices in sorted(placed.items())
            )
            console.print(f"  placed at c={conc}: {where or 'nothing'}", highlight=False)
    console.print(
        f"load average (1, 5, 15 min) at the end: {result['load_average']}; "
        f"wall {result['wall_s']} s",
        highlight=False,
    )
    for key, value in result["ratios"].items():
        console.print(f"{key}: {value}", highlight=False)
    for name, goal in result["goals"].items():
        met = {True: "met", False: "missed", None: "n/a"}[goal["met"]]
        console.print(f"{name}: {goal['value']} (goal {goal['goal']}): {met}", highlight=False)


def run_bench_placement(
    console: Console,
    as_json: bool,
    seconds: float = 5.0,
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
    runtimes: Sequence[str] = RUNTIMES,
    load: str = "two",
    rounds: int = 2,
) -> int:
    """Run the placement comparison and print it (progress on stderr)."""
    err = Console(stderr=True)
    result = run_placement_bench(
        seconds,
        concurrency,
        load=load,
        rounds=rounds,
        runtimes=runtimes,
        progress=lambda message: err.print(message, highlight=False),
    )
    if as_json:
        print_json(console, result)
    else:
        print_placement_report(console, result)
    return 0
