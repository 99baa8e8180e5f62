"""Where ref-8xa100's LLM requests spend their time, and what sets p99 - p50.

``python benchmarks/scenarios/ref_8xa100_breakdown.py [hetero round_robin least_connections]``
simulates the scenario (the same run as ``run.py``: the figures match its table) with every
batch, prefill and decode window recorded, then prints for each placement:

* the LLM requests (image + question) whose latency lies near the run's p50 and near its p99
  (within 10 and 20 ms), and all of them: the mean of each part of their latency (vision queue
  and run, the wait before their prefill, their prefill, then on their device during their
  decode: decode steps, other requests' prefills, other stages' batches) and the counts;
* the counterfactual "fleet-average stall": each LLM request's stalls (others' prefills and
  other stages' batches on its device while it decodes) replaced by the fleet's stall work in
  the same window over the device count, as if every device had taken an equal share of it at
  every instant; p99 - p50 with that;
* the LLM joins over the fleet (prefill starts): their rate, burstiness in 0.25 s bins
  (variance over mean, 1 for Poisson arrivals), counts in 3 s windows, and the autocorrelation
  peak at a lag of 2-5 s (the closed loop's cycle).

It reads the simulator's private event handlers (a subclass records what they did), so it is
an analysis tool beside the simulator, not part of it. docs/simulator.md quotes its figures.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import load_policy
from hetero.framework.registry import Registry
from hetero.framework.scheduler import Dispatch
from hetero.framework.simulator import load_workload
from hetero.framework.simulator import run as sim_run
from hetero.framework.simulator.report import ALIASES

HERE = Path(__file__).resolve().parent / "ref-8xa100"
LLM_ROUTE = "/v1/image/question"
PARTS = (
    "vision_queue",
    "vision_run",
    "prefill_wait",
    "prefill",
    "decode_steps",
    "others_prefills",
    "other_batches",
)
COUNTS = ("joins_in_life", "batches_in_life")


class _Recording(sim_run._Simulation):
    """The simulation, recording each request's stage times and each device's spans."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.times: dict[int, dict[str, Any]] = defaultdict(dict)
        self.spans: dict[str, list[tuple[float, float, str]]] = defaultdict(list)

    def _enqueue_ready(self, run: Any) -> bool:
        times = self.times[run.request.index]
        times["arrival"], times["route"] = run.request.arrival, run.request.route
        for step in run.pipeline.ready_steps(run.done, run.started):
            times["enqueued:" + self.stage_of[run.pipeline.name][step]] = self.clock.now()
        return bool(super()._enqueue_ready(run))

    def _start(self, device: Any, key: str, batch: list[Dispatch]) -> None:
        now = self.clock.now()
        super()._start(device, key, batch)
        end = max(e[0] for e in self.events if e[2] == sim_run.BATCH_DONE and e[3][1] is batch)
        self.spans[device.spec.id].append((now, end, key.split("/", maxsplit=1)[0]))
        for dispatch in batch:
            times = self.times[int(dispatch.task.request_id)]
            times["start:" + dispatch.task.stage], times["end:" + dispatch.task.stage] = now, end

    def _prefill_starts(self, device: Any, key: str, work: Any, now: float) -> None:
        super()._prefill_starts(device, key, work, now)
        for sequence in work.joining:
            times = self.times[int(sequence.item.task.request_id)]
            if "prefill_start" not in times:
                times["prefill_start"], times["prefill_end"] = now, work.end
                times["device"] = device.spec.id
                times["dispatched"] = sequence.item.task.enqueued_at

    def _engine_done(self, device_id: str, key: str, generation: int) -> None:
        engine = self.devices[device_id].engines[key]
        work = engine.work
        if generation == engine.generation and work is not None:
            self.spans[device_id].append((work.start, self.clock.now(), work.kind))
        super()._engine_done(device_id, key, generation)

    def _finish(self, dispatch: Dispatch, device_id: str, run_s: float, batch_size: int) -> None:
        self.times[int(dispatch.task.request_id)]["finished"] = self.clock.now()
        super()._finish(dispatch, device_id, run_s, batch_size)


def _stall(spans: list[tuple[float, float, str]], start: float, end: float) -> dict[str, float]:
    """Seconds of each kind of work on a device within [start, end), and how many began."""
    out = {"decode_steps": 0.0, "others_prefills": 0.0, "other_batches": 0.0}
    out.update(dict.fromkeys(COUNTS, 0.0))
    for s, e, kind in spans:
        if e <= start or s >= end:
            continue
        part = {"decode": "decode_steps", "prefill": "others_prefills"}.get(kind, "other_batches")
        out[part] += min(e, end) - max(s, start)
        if s >= start:
            if kind == "prefill":
                out["joins_in_life"] += 1
            elif kind != "decode":
                out["batches_in_life"] += 1
    return out


def breakdown(name: str) -> dict[str, Any]:
    """Simulate one placement and return its figures (seconds and counts)."""
    policy = load_policy(HERE / ".." / ".." / ".." / "policies" / "sim" / "8xa100.yaml")
    workload = load_workload(HERE / "workload.yaml")
    fleet = resolve_fleet(policy, Registry(use_entry_points=False))
    placement, eviction = ALIASES[name]
    sim = _Recording(policy, fleet.devices, fleet.topology(), workload, placement, eviction)
    summary = sim.run().summary()
    warmup = workload.spec.warmup_s
    stalls = np.array(
        sorted((s, e) for spans in sim.spans.values() for s, e, kind in spans if kind != "decode")
    )

    def fleet_stall(start: float, end: float) -> float:
        done = np.clip(
            np.array([start, end])[:, None] - stalls[:, 0], 0, stalls[:, 1] - stalls[:, 0]
        )
        return float(done[1].sum() - done[0].sum()) / len(sim.spans)

    others, llm = [], []
    for times in sim.times.values():
        if times.get("arrival", 0.0) < warmup or "finished" not in times:
            continue
        latency = times["finished"] - times["arrival"]
        if times["route"] != LLM_ROUTE:
            others.append(latency)
            continue
        begin, end = times["prefill_end"], times["finished"]
        row = {
            "latency": latency,
            "vision_queue": times["start:vision_encode"] - times["enqueued:vision_encode"],
            "vision_run": times["end:vision_encode"] - times["start:vision_encode"],
            "prefill_wait": times["prefill_start"] - times["enqueued:llm_decode"],
            "prefill": begin - times["prefill_start"],
            **_stall(sim.spans[times["device"]], begin, end),
        }
        own = row["others_prefills"] + row["other_batches"]
        row["fair_latency"] = latency - own + fleet_stall(begin, end)
        llm.append(row)
    every = np.array(others + [r["latency"] for r in llm])
    p50, p99 = np.percentile(every, 50), np.percentile(every, 99)
    fair = np.array(others + [r["fair_latency"] for r in llm])
    joins = np.array(
        [t["prefill_start"] for t in sim.times.values() if warmup <= t.get("prefill_start", -1)]
    )
    bin_s, window_s = 0.25, 3.0
    counts, _ = np.histogram(joins, bins=np.arange(warmup, joins.max() + bin_s, bin_s))
    counts = counts[: int((workload.spec.duration_s - warmup) / bin_s)]
    windows = np.convolve(counts, np.ones(int(window_s / bin_s)), "valid")
    centred = counts - counts.mean()
    lags = range(int(2 / bin_s), int(5 / bin_s))
    autocorr = [float(np.dot(centred[:-k], centred[k:]) / np.dot(centred, centred)) for k in lags]
    peak = int(np.argmax(autocorr))
    return {
        "summary": summary,
        "p50": p50,
        "p99": p99,
        "groups": {
            "near p50": [r for r in llm if abs(r["latency"] - p50) < 0.010],
            "near p99": [r for r in llm if abs(r["latency"] - p99) < 0.020],
            "all LLM": llm,
        },
        "fair_spread": float(np.percentile(fair, 99) - np.percentile(fair, 50)),
        "joins_per_s": counts.mean() / bin_s,
        "bin_dispersion": counts.var() / counts.mean(),
        "window_mean": windows.mean(),
        "window_std": windows.std(),
        "autocorr_peak": autocorr[peak],
        "autocorr_lag_s": (lags[0] + peak) * bin_s,
    }


def main(names: list[str]) -> None:
    for name in names or ["hetero", "round_robin", "least_connections"]:
        figures = breakdown(name)
        summary = figures["summary"]
        print(
            f"{name}: p50 {figures['p50'] * 1e3:.1f} ms, p99 {figures['p99'] * 1e3:.1f} ms, "
            f"p99 - p50 {summary['p99_minus_p50_ms']:.1f} ms, memory std "
            f"{summary['memory_utilisation_std_pct']:.4f} %"
        )
        for label, rows in figures["groups"].items():
            parts = " ".join(f"{p} {np.mean([r[p] for r in rows]) * 1e3:.0f}" for p in PARTS)
            counts = " ".join(f"{c} {np.mean([r[c] for r in rows]):.1f}" for c in COUNTS)
            print(f"  {label} ({len(rows)}): ms: {parts}; {counts}")
        print(
            f"  with every LLM request given its window's fleet-average stall: p99 - p50 "
            f"{figures['fair_spread'] * 1e3:.1f} ms"
        )
        print(
            f"  LLM joins: {figures['joins_per_s']:.1f}/s, 0.25 s bins variance/mean "
            f"{figures['bin_dispersion']:.2f} (Poisson 1), 3 s windows {figures['window_mean']:.0f}"
            f" +- {figures['window_std']:.1f} (Poisson +- {np.sqrt(figures['window_mean']):.1f}),"
            f" autocorrelation {figures['autocorr_peak']:.2f} at {figures['autocorr_lag_s']:.2f} s"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
