"""``hetero bench scheduler`` and ``hetero bench cache``: figures measured side by side."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from hetero.framework.bench.scheduler import QUEUE_LENGTHS, run_scheduler_bench
from hetero.framework.bench.scheduler_sim import measure_simulator
from hetero.framework.output import print_json


def run_bench_scheduler(console: Console, as_json: bool, devices: int = 64) -> int:
    """Measure and print p50/p99 per queue length, the speed-up and how cost grows, on a
    fleet of ``devices`` (the naive reference takes fewer decisions on a large one)."""
    results = run_scheduler_bench(
        naive_decisions=max(50, 300 * 64 // devices), devices_count=devices
    )
    by = {(r.implementation, r.queued): r for r in results}
    rows: list[dict[str, Any]] = []
    for queued in QUEUE_LENGTHS:
        ours, naive = by[("hetero", queued)], by[("naive", queued)]
        rows.append(
            {
                "queued": queued,
                "hetero": ours.to_dict(),
                "naive": naive.to_dict(),
                "speedup_p99": round(naive.p99_us / ours.p99_us, 1),
                "speedup_p50": round(naive.p50_us / ours.p50_us, 1),
            }
        )
    smallest, largest = rows[0], rows[-1]
    growth = {
        "hetero_p50_ratio_10000_vs_100": round(
            largest["hetero"]["p50_us"] / smallest["hetero"]["p50_us"], 2
        ),
        "naive_p50_ratio_10000_vs_100": round(
            largest["naive"]["p50_us"] / smallest["naive"]["p50_us"], 2
        ),
    }
    simulator = measure_simulator()
    goal_us = 50 if devices <= 64 else 100
    payload: dict[str, Any] = {
        "devices": devices,
        "stages": 8,
        "goal": {
            "cpu_p99_us_at_10000": goal_us,
            "speedup_at_10000": 10,
            "simulator_requests_per_cpu_s_at_1000_devices": simulator["goal_requests_per_cpu_s"],
        },
        "results": rows,
        "growth": growth,
        "simulator": simulator,
    }
    if as_json:
        print_json(console, payload)
        return 0
    table = Table(
        title=f"Scheduling decision latency, {devices:,} devices x 8 stages", title_justify="left"
    )
    columns = ("queued", "hetero p50", "hetero p99", "hetero CPU p50", "hetero CPU p99")
    for column in (*columns, "naive p50", "naive p99", "speed-up p99"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            f"{row['queued']:,}",
            f"{row['hetero']['p50_us']:.1f} us",
            f"{row['hetero']['p99_us']:.1f} us",
            f"{row['hetero']['cpu_p50_us']:.1f} us",
            f"{row['hetero']['cpu_p99_us']:.1f} us",
            f"{row['naive']['p50_us']:.0f} us",
            f"{row['naive']['p99_us']:.0f} us",
            f"{row['speedup_p99']}x",
        )
    console.print(table)
    console.print(
        f"p50 grows {growth['hetero_p50_ratio_10000_vs_100']}x from 100 to 10,000 queued "
        f"(naive: {growth['naive_p50_ratio_10000_vs_100']}x)"
    )
    met = rows[-1]["hetero"]["cpu_p99_us"] < goal_us
    console.print(f"goal: CPU p99 < {goal_us} us at 10,000 queued: {'met' if met else 'MISSED'}")
    console.print(
        f"simulator, {simulator['devices']:,} devices ({simulator['requests']:,} requests): "
        f"{simulator['requests_per_cpu_s']:,.0f} requests per CPU second (goal "
        f"{simulator['goal_requests_per_cpu_s']:,.0f}), {simulator['requests_per_wall_s']:,.0f} "
        f"per wall second; {simulator['cpu_s']:.2f} s CPU, {simulator['wall_s']:.2f} s wall"
    )
    return 0


def run_bench_cache(console: Console, as_json: bool) -> int:
    """Each tier's hit against the raw library read, a Bloom-rejected miss, L1 hit rates."""
    from hetero.framework.bench.cache import run_cache_bench

    results = run_cache_bench()
    if as_json:
        print_json(console, results)
        return 0
    table = Table(title="Feature cache, 5 KB embedding", title_justify="left")
    for column in ("read", "p50", "p99"):
        table.add_column(column, justify="right")
    for name in (
        "l1_hit",
        "bloom_rejected_miss",
        "l3_hit",
        "l3_lookup",
        "disk_tier_get",
        "disk_tier_get_and_decode",
        "disk_tier_read_and_decode",
        "raw_lmdb_get",
        "raw_lmdb_get_and_decode",
        "raw_diskcache_get",
        "l2_hit",
        "raw_redis_get",
        "l2_get_many_8",
        "raw_redis_mget_8",
    ):
        figures = results.get(name)
        if isinstance(figures, dict):
            table.add_row(name, f"{figures['p50_us']:.2f} us", f"{figures['p99_us']:.2f} us")
    console.print(table)
    for name, ratio in results["ratios"].items():
        console.print(f"{name}: {ratio:.2f}x")
    modules = results["compiled_modules"]
    console.print(
        "hetero.cache modules compiled (mypyc): "
        + (", ".join(name for name, native in modules.items() if native) or "none")
    )
    rates = results["l1_hit_rate"]
    console.print(
        f"L1 hit rate on a skewed stream with scans: TinyLFU {rates['tinylfu']:.3f}, "
        f"LRU {rates['lru']:.3f}"
    )
    _print_replay(console, results["trace_replay"])
    if isinstance(results.get("redis"), str):
        console.print(f"redis: {results['redis']}")
    return 0


def _print_replay(console: Console, replay: dict[str, Any]) -> None:
    """The trace replay's hit rates, in percent, the points against LRU, the tier's under other
    key hashings, and the replay's cost against the LRU class."""
    table = Table(title="Trace replay, hit rate %", title_justify="left")
    for column in (
        "stream",
        "capacity",
        "LRU",
        "fixed window",
        "adaptive",
        "fixed - LRU",
        "adaptive - LRU",
        "goal met",
        "TinyLFU before",
        "other hashings",
    ):
        table.add_column(column, justify="right")
    for stream, figures in replay.items():
        if not isinstance(figures, dict) or "other_key_hashes" not in figures:
            continue  # a stream not measured (a sentence saying why), or the cost
        others = figures["other_key_hashes"]
        for share, row in figures.items():
            if not share.endswith("%"):
                continue
            spread = others[share]
            table.add_row(
                stream,
                share,
                f"{100 * row['lru']:.2f}",
                f"{100 * row['fixed_window']:.2f}",
                f"{100 * row['memory_tier']:.2f}",
                f"{row['fixed_window_minus_lru_points']:+.2f}",
                f"{row['memory_tier_minus_lru_points']:+.2f}",
                "yes" if row["meets_goal"] else "NO",
                f"{100 * row['tinylfu_before']:.2f}",
                f"{100 * spread['memory_tier_mean']:.2f} mean, "
                f"{spread['below_goal']} of {others['hashes']} below goal",
            )
    console.print(table)
    cost = replay.get("cost")
    if isinstance(cost, dict):
        console.print(
            f"get-or-put over the replay: memory tier {cost['memory_tier_us_per_lookup']:.3f} us, "
            f"OrderedDict LRU {cost['lru_us_per_lookup']:.3f} us a lookup: "
            f"{cost['memory_tier_over_lru']:.2f}x (thread CPU time, "
            f"{'compiled' if cost['compiled'] else 'interpreted'})"
        )
