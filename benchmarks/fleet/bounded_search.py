"""The bounded (branch-and-bound) placement search against the full scan, side by side.

1. ``simulate()`` on the 1,000-device fleet (``policies/sim/1000xa100.yaml``, the workload
   ``framework/bench/fleet_workload.yaml``) with every decision searched each way: the figures (and
   every request's latency) must be identical, and each run's wall time is printed.
2. Decision latency (``hetero bench scheduler``'s fleet and tasks, 10,000 queued) at 1,000 and
   10,000 devices: two schedulers fed the same tasks, one searching each way, their decisions
   timed alternately (so the machine's load drifts alike over both) and checked to be the same
   device every time.

Run: ``python benchmarks/fleet/bounded_search.py [--decisions N] [--sizes 1000,10000]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from hetero.framework.bench.scheduler import _task, bench_policy
from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import load_policy
from hetero.framework.scheduler import placement
from hetero.framework.scheduler.clock import VirtualClock
from hetero.framework.scheduler.scheduler import Dispatch, Scheduler
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.report import table_rows
from hetero.framework.simulator.run import simulate
from hetero.framework.topology import Topology

ROOT = Path(__file__).resolve().parents[2]


def simulated(search: str) -> tuple[dict[str, object], list[float], float, float]:
    """One simulation with ``search`` forced through the threshold (``simulate()`` builds its
    own scheduler): its table row without the wall time, every latency, wall and CPU s."""
    policy = load_policy(str(ROOT / "policies" / "sim" / "1000xa100.yaml"))
    devices = simulated_devices(policy.spec.devices.simulated)
    topology = Topology(devices)
    workload = load_workload(str(ROOT / "framework" / "bench" / "fleet_workload.yaml"))
    saved = placement.BOUNDED_SEARCH_MIN_DEVICES
    placement.BOUNDED_SEARCH_MIN_DEVICES = 0 if search == "bounded" else 1 << 62
    try:
        cpu = time.thread_time()
        metrics = simulate(policy, devices, topology, workload)
        cpu = time.thread_time() - cpu
    finally:
        placement.BOUNDED_SEARCH_MIN_DEVICES = saved
    row = dict(table_rows([metrics])[0])
    row.pop("wall_s", None)
    row.pop("cpu_s", None)
    return row, list(metrics.latencies), metrics.wall_s, cpu


def _load() -> str:
    with open("/proc/loadavg") as file:
        return " ".join(file.read().split()[:3])


def paired_decisions(size: int, decisions: int, queued: int = 10_000) -> dict[str, list[float]]:
    """CPU microseconds of each decision, full scan and bounded search, taken alternately."""
    policy = bench_policy(size)
    devices = simulated_devices(policy.spec.devices.simulated)
    topology = Topology(devices)
    ids = [d.id for d in devices]
    pairs = []
    for search in ("full", "bounded"):
        clock = VirtualClock()
        pairs.append((search, clock, Scheduler(policy, devices, topology, clock, search=search)))
    rng = random.Random(42)
    for _ in range(queued):
        for _, clock, _ in pairs:
            clock.advance(1e-4)
        task = _task(rng, pairs[0][1].now(), ids)
        for _, _, scheduler in pairs:
            scheduler.enqueue(_copy(task))
    cpu: dict[str, list[float]] = {"full": [], "bounded": []}
    for _ in range(decisions):
        chosen = []
        for search, clock, scheduler in pairs:
            clock.advance(1e-4)
            started = time.thread_time_ns()
            outcome = scheduler.dispatch()
            cpu[search].append((time.thread_time_ns() - started) / 1000.0)
            assert isinstance(outcome, Dispatch)
            chosen.append(outcome.device_id)
            scheduler.completed(outcome, ok=True, run_s=outcome.decision.compute_s)
        assert chosen[0] == chosen[1], chosen
        task = _task(rng, pairs[0][1].now(), ids)
        for _, _, scheduler in pairs:
            scheduler.enqueue(_copy(task))
    return cpu


def _copy(task: object) -> object:
    import dataclasses

    return dataclasses.replace(task, id=task.id)  # type: ignore[type-var]


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"p50 {statistics.median(ordered):6.1f} us, p99 {p99:6.1f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--skip-sim", action="store_true")
    args = parser.parse_args()
    print("load average:", _load())
    if not args.skip_sim:
        rows = {}
        for run in range(args.runs):
            for search in ("full", "bounded"):
                row, latencies, wall, cpu = simulated(search)
                print(f"simulate {search:7s} run {run}: wall {wall:.3f} s, cpu {cpu:.3f} s")
                if search in rows:
                    assert rows[search] == (row, latencies)
                rows[search] = (row, latencies)
        same = rows["full"] == rows["bounded"]
        print("identical figures and latencies:", same)
        print(json.dumps(rows["bounded"][0], indent=None, default=str))
    for size in (int(s) for s in args.sizes.split(",")):
        cpu = paired_decisions(size, args.decisions)
        faster = statistics.median(f / b for f, b in zip(cpu["full"], cpu["bounded"], strict=True))
        print(
            f"{size:6d} devices, same decisions: CPU full {_summary(cpu['full'])}; "
            f"bounded {_summary(cpu['bounded'])}; median pair ratio full/bounded {faster:.2f}"
        )
    print("load average:", _load())


if __name__ == "__main__":
    main()
