"""``hetero bench serve --placement``: free placement against every single-runtime pinning and
the hand-tuned assignment, side by side in one run, on the serve bench's load.

The stacks, each a ``hetero serve`` child process with the feature cache off:

- ``pinned:<runtime>``: every stage pinned to one runtime (ONNX Runtime, OpenVINO, torch);
- ``free (first start)``: unpinned, with no warm-up timings kept: warm-up times every
  runtime, keeps the figures, and is measured for start-up and idle memory only;
- ``hand-tuned``: each stage pinned to the runtime its own warm-up probe ran fastest on
  (what a person reading those figures would pin);
- ``free``: unpinned again, starting with the kept figures (a restart), measured in full.

Start-up and idle memory are each stack's alone (they start one at a time); the points are
then measured interleaved over rounds (:func:`run_placement_bench`), with every stack up and
idle between its turns. The report gives per concurrency free over the
best pinning and over the hand-tuned assignment, start-up and idle memory against the best
pinning's, where each stage ran (placements per device) and why warm-up left a runtime idle.
The warm-up timings live in a file of this run (``HETERO_CALIBRATION_FILE``), so a user's kept
figures neither help nor hurt it. Timing is never pass/fail.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from hetero.framework.bench import serve_procs as bench_procs
from hetero.framework.bench.serve import POLICY, _warm, _warmup_s
from hetero.framework.bench.serve_load import closed_loop, median_point
from hetero.framework.bench.serve_mix import RequestMix, new_nonce
from hetero.framework.bench.serve_procs import environment
from hetero.framework.bench.serve_stages import SIX_STAGE_POLICY, StageMix

__all__ = [
    "RUNTIMES",
    "Load",
    "assignment_policy",
    "counts_since",
    "load_named",
    "placement_counts",
    "placement_ratios",
    "run_placement_bench",
]

RUNTIMES = ("onnxruntime", "openvino", "torch")
# A first start times six stages on every runtime: minutes on a busy two-core machine.
READY_TIMEOUT_S = 900.0
Progress = Callable[[str], None]


def assignment_policy(
    policy: str, folder: Path, label: str, assignment: Mapping[str, str] | None
) -> str:
    """A copy of ``policy`` with the feature cache off and ``server.runtimes`` set to
    ``assignment`` (None: no pins, placement is free)."""
    from hetero.framework.policy import builtin_policy_text

    name = policy.removeprefix("builtin:")
    text = builtin_policy_text(name) if policy.startswith("builtin:") else Path(policy).read_text()
    data = yaml.safe_load(text)
    data["cache"] = {**data.get("cache", {}), "enabled": False}
    server = data.setdefault("server", {})
    server.pop("runtimes", None)
    if assignment:
        server["runtimes"] = dict(assignment)
    target = folder / f"{name}-{label.replace(':', '-').replace(' ', '-')}.yaml"
    target.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(target)


def _stages(policy: str) -> list[str]:
    from hetero.framework.policy import builtin_policy_text

    name = policy.removeprefix("builtin:")
    text = builtin_policy_text(name) if policy.startswith("builtin:") else Path(policy).read_text()
    return list(yaml.safe_load(text)["stages"])


def _timed_runtimes(stages: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per stage, the runtimes warm-up could time it on (those that can run it)."""
    return {
        stage["stage"]: {
            device.split(":", 1)[1].split("/", 1)[0]
            for device, seconds in stage.get("warmup_timings_s", {}).items()
            if isinstance(seconds, int | float)
        }
        for stage in stages
    }


def _fastest_alone(stages: list[dict[str, Any]]) -> dict[str, str]:
    """Per stage, the runtime whose warm-up probe was fastest (the free first start's
    figures: each runtime timed alone, one after another)."""
    out = {}
    for stage in stages:
        timed = {
            device: seconds
            for device, seconds in stage.get("warmup_timings_s", {}).items()
            if isinstance(seconds, int | float)
        }
        if timed:
            device = min(timed, key=timed.__getitem__)
            out[stage["stage"]] = device.split(":", 1)[1].split("/", 1)[0]
    return out


@dataclass(slots=True)
class _Stack:
    """One running ``hetero serve`` child and what was measured of it."""

    label: str
    url: str
    process: subprocess.Popen[bytes]
    figures: dict[str, Any]
    rounds: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # per concurrency, stage -> device -> batches placed there over that concurrency's rounds
    # (warm-up requests included: they are the point's too)
    placed: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)


def _warm_routes(url: str, mix: Any, each: int = 2) -> None:
    """``each`` requests of every route of ``mix`` (the six-stage load), so idle memory is
    measured with every stage exercised."""
    stream = mix.stream(0)
    seen: dict[str, int] = {}
    routes = set(mix.routes())
    with httpx.Client(base_url=url, timeout=120.0, trust_env=False) as client:
        while any(seen.get(route, 0) < each for route in routes):
            request = next(stream)
            if seen.get(request.route, 0) >= each:
                continue
            response = client.post(
                request.route, content=request.body, headers={"content-type": "application/json"}
            )
            response.raise_for_status()
            seen[request.route] = seen.get(request.route, 0) + 1


@dataclass(frozen=True, slots=True)
class Load:
    """What the stacks serve and are sent: the policy, a request mix per point, a warm-up."""

    name: str
    policy: str
    mix: Callable[[], Any]
    warm: Callable[[str], None]


def load_named(name: str) -> Load:
    """``two``: the serve bench's load (70 % /embed, 30 % /vision, policy bench-serve);
    ``six``: the six stages of the default policy (:mod:`serve_stages`, policy bench-six)."""
    if name == "two":
        return Load("two", POLICY, lambda: RequestMix(new_nonce()), _warm)
    if name == "six":
        return Load(
            "six",
            SIX_STAGE_POLICY,
            StageMix,  # the same request streams at every point (:class:`StageMix`)
            lambda url: _warm_routes(url, StageMix()),
        )
    raise ValueError(f"unknown load {name!r} (loads: two, six)")


def _start(
    label: str, policy_path: str, folder: Path, report: Progress, warm: Callable[[str], None]
) -> _Stack:
    """Start a stack, wait until it is ready, exercise both routes, take start-up and idle
    memory, and leave it running."""
    port = bench_procs.free_port()
    url = f"http://127.0.0.1:{port}"
    log = folder / f"{label.replace(':', '-').replace(' ', '-')}.log"
    args = ["serve", "--policy", policy_path, "--port", str(port)]
    report(f"{label}: starting")
    process, figures = bench_procs.launch(
        bench_procs.CLI_MODULE, args, log, url, "/ready", READY_TIMEOUT_S, warm, label
    )
    return _Stack(label, url, process, figures)


def placement_counts(stages: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Stage -> device -> placements so far, from ``/v1/devices``' stages."""
    return {stage["stage"]: dict(stage.get("placements", {})) for stage in stages}


def counts_since(
    before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, int]]:
    """The placements made between two :func:`placement_counts` (devices with none left out)."""
    out: dict[str, dict[str, int]] = {}
    for stage, devices in after.items():
        made = {d: n - before.get(stage, {}).get(d, 0) for d, n in devices.items()}
        if kept := {d: n for d, n in made.items() if n > 0}:
            out[stage] = kept
    return out


def _add_counts(total: dict[str, dict[str, int]], more: Mapping[str, Mapping[str, int]]) -> None:
    for stage, devices in more.items():
        row = total.setdefault(stage, {})
        for device, n in devices.items():
            row[device] = row.get(device, 0) + n


def _stages_of(stack: _Stack) -> list[dict[str, Any]]:
    with httpx.Client(base_url=stack.url, timeout=10.0, trust_env=False) as client:
        stages: list[dict[str, Any]] = client.get("/v1/devices").json().get("stages", [])
    return stages


def run_placement_bench(
    seconds: float = 5.0,
    concurrency: Sequence[int] = (1, 8, 32),
    *,
    load: str = "two",
    runtimes: Sequence[str] = RUNTIMES,
    rounds: int = 2,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Measure every stack (module doc) and return the report.

    The stacks start one at a time (start-up and idle memory are each one's alone) and then
    all stay up, idle, while the points are measured interleaved: for each round and
    concurrency every stack in turn, the order rotated each round. A stack's figure at a
    concurrency is its median round; a load that drifts over the run (other work on the
    machine) then falls on every stack alike instead of on whichever ran last.
    """
    report = progress or (lambda message: None)
    chosen = load_named(load)
    policy = chosen.policy
    stages = _stages(policy)
    began = time.monotonic()
    running: list[_Stack] = []
    first: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hetero-bench-placement-") as directory:
        folder = Path(directory)

        def path(label: str, assignment: Mapping[str, str] | None) -> str:
            return assignment_policy(policy, folder, label, assignment)

        try:
            with environment("HETERO_CALIBRATION_FILE", str(folder / "calibration.json")):
                calibrating = _start(
                    "free (first start)", path("free-first", None), folder, report, chosen.warm
                )
                running.append(calibrating)  # stopped below, or by ``finally`` if this fails
                first = {
                    **calibrating.figures,
                    "stages": _stages_of(calibrating),
                    "assignment": "free",
                }
                bench_procs.stop(calibrating.process)
                running.remove(calibrating)
                timed = _timed_runtimes(first["stages"])
                assignments: dict[str, Any] = {}
                for runtime in runtimes:
                    label = f"pinned:{runtime}"
                    # A stage the runtime cannot run is left to the runtimes that can.
                    pins = {stage: runtime for stage in stages if runtime in timed.get(stage, ())}
                    assignments[label] = pins
                    running.append(_start(label, path(label, pins), folder, report, chosen.warm))
                tuned = _fastest_alone(first["stages"])
                assignments["hand_tuned"] = tuned
                running.append(
                    _start("hand_tuned", path("hand-tuned", tuned), folder, report, chosen.warm)
                )
                running.append(_start("free", path("free", None), folder, report, chosen.warm))
            for round_index in range(rounds):
                for workers in concurrency:
                    shift = round_index % len(running)
                    for stack in running[shift:] + running[:shift]:
                        report(f"round {round_index + 1}: {stack.label} at concurrency {workers}")
                        before = placement_counts(_stages_of(stack))
                        point = closed_loop(
                            stack.url,
                            chosen.mix(),
                            workers,
                            warmup_s=_warmup_s(seconds),
                            seconds=seconds,
                        )
                        stack.rounds.setdefault(str(workers), []).append(point)
                        _add_counts(
                            stack.placed.setdefault(str(workers), {}),
                            counts_since(before, placement_counts(_stages_of(stack))),
                        )
            stacks: dict[str, Any] = {}
            for stack in running:
                stacks[stack.label] = {
                    **stack.figures,
                    "assignment": assignments.get(stack.label, "free"),
                    "points": {c: median_point(r) for c, r in stack.rounds.items()},
                    "placed_per_concurrency": stack.placed,
                    "rss_after_load_mb": bench_procs.tree_rss_mb(stack.process.pid),
                    "stages": _stages_of(stack),
                }
            stacks["free_first_start"] = first
        finally:
            for stack in running:
                bench_procs.stop(stack.process)
    result: dict[str, Any] = {
        "seconds": seconds,
        "warmup_s": _warmup_s(seconds),
        "rounds": rounds,
        "concurrency": list(concurrency),
        "load": load,
        "policy": policy,
        "cpus": os.cpu_count(),
        "stacks": stacks,
        "wall_s": round(time.monotonic() - began, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    result["ratios"], result["goals"] = placement_ratios(stacks, list(concurrency), load)
    return result


def _div(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    return round(float(a) / float(b), 2)


def placement_ratios(
    stacks: dict[str, Any], concurrency: list[int], load: str = "two"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Free over the best pinning and over the hand-tuned assignment per concurrency (on the
    six-stage load, whose stages differ in their fastest runtime, free is read against 1.1x
    the best pinning at the middle concurrency); start-up and idle memory of free (a restart,
    timings kept) and of its first start over the best pinning's (the pinning with the most
    requests per second at the middle concurrency)."""
    pinned = {name: s for name, s in stacks.items() if name.startswith("pinned:")}
    free, tuned = stacks["free"], stacks.get("hand_tuned")
    out: dict[str, Any] = {}
    goals: dict[str, tuple[Any, str]] = {}
    mid = "8" if 8 in concurrency else str(sorted(concurrency)[len(concurrency) // 2])
    for c in map(str, concurrency):
        rates = {name: s["points"][c]["req_s"] for name, s in pinned.items()}
        best = max(rates, key=rates.__getitem__)
        out[f"c{c}_best_pinning"] = best
        out[f"c{c}_free_vs_best_pinning"] = _div(free["points"][c]["req_s"], rates[best])
        goals[f"c{c} free placement vs best single-runtime pinning ({best})"] = (
            out[f"c{c}_free_vs_best_pinning"],
            ">= 1.1" if load == "six" and c == mid else ">= 1.0",
        )
        if tuned is not None:
            out[f"c{c}_free_vs_hand_tuned"] = _div(
                free["points"][c]["req_s"], tuned["points"][c]["req_s"]
            )
            goals[f"c{c} free placement vs hand-tuned assignment"] = (
                out[f"c{c}_free_vs_hand_tuned"],
                ">= 1.0",
            )
    reference = max(pinned, key=lambda name: pinned[name]["points"][mid]["req_s"])
    out["reference_pinning"] = reference
    for label, stack in (("free", free), ("free_first_start", stacks.get("free_first_start"))):
        if stack is None:
            continue
        for figure in ("startup_s", "idle_rss_mb"):
            out[f"{label}_{figure}_vs_reference"] = _div(stack[figure], pinned[reference][figure])
    goals[f"free start-up (timings kept) vs {reference}"] = (
        out["free_startup_s_vs_reference"],
        "<= 1.3",
    )
    goals[f"free idle RSS vs {reference}"] = (out["free_idle_rss_mb_vs_reference"], "<= 1.3")
    return out, {
        name: {"value": value, "goal": goal, "met": _met(value, goal)}
        for name, (value, goal) in goals.items()
    }


def _met(value: Any, goal: str) -> bool | None:
    if not isinstance(value, int | float):
        return None
    op, bound = goal.split()
    limit = float(bound)
    return {">=": value >= limit, "<=": value <= limit}[op]
