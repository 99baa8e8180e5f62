"""``hetero bench serve``: hetero's server against an in-process loop and a plain FastAPI
baseline, side by side in one run, on the peers harness's load (closed loop, 70 % ``/embed`` of
1-4 sentences, 30 % ``/vision`` of a 68-223 KB image) and the same ``hetero.models`` stages.

Per stack: a cold-cache run at each concurrency (every request's content is new) and a run where
30 % of requests repeat earlier content, which only hetero's feature cache can turn into less
work. FastAPI and hetero run as child processes, so their start-up (launch to ready) and idle
memory (RSS of the process tree, both models loaded and warmed) are theirs alone; they start one
at a time, then all stay up while the points are measured interleaved over rounds (each point
its median round), so that drift on the machine falls on every stack alike. ONNX Runtime
spin-waiting is off for every stack (the executor's setting). Timing is never pass/fail: the
report gives figures, ratios and the goals they are read against.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from hetero.framework.bench import serve_procs as bench_procs
from hetero.framework.bench.engine import engine_overhead
from hetero.framework.bench.serve_load import (
    closed_loop,
    closed_loop_groups,
    inprocess_loop,
    median_point,
)
from hetero.framework.bench.serve_mix import RequestMix, new_nonce
from hetero.framework.bench.serve_procs import environment

__all__ = ["DEFAULT_CONCURRENCY", "POLICY", "REPEAT_SHARE", "ratios", "run_serve_bench"]

DEFAULT_CONCURRENCY = (1, 8, 32)
REPEAT_SHARE = 0.3
POLICY = "builtin:bench-serve"
READY_TIMEOUT_S = 120.0
RAY_SERVE_C8_REQ_S = 54.0  # the peers' figure on this machine kind (spin off); not this run
Progress = Callable[[str], None]


def _warmup_s(seconds: float) -> float:
    return min(5.0, max(1.0, seconds / 4))


def _inprocess(seconds: float, threads: int) -> dict[str, Any]:
    """The same model stages called directly, one request at a time (no HTTP, no JSON)."""
    from hetero.models.embed import TextEmbedder
    from hetero.models.vision import VisionEncoder

    embedder, encoder = TextEmbedder(threads=threads), VisionEncoder(threads=threads)
    began = time.perf_counter()
    embedder.load()
    encoder.load()
    load_s = time.perf_counter() - began

    def handle(route: str, payload: dict[str, Any]) -> Any:
        if route == "/embed":
            return embedder.embed(payload["texts"]).tolist()
        result = encoder.encode([base64.b64decode(payload["image_b64"])])[0]
        return result.embedding.tolist(), result.top1

    try:
        mix = RequestMix(new_nonce())
        point = inprocess_loop(handle, mix, warmup_s=_warmup_s(seconds), seconds=seconds)
    finally:
        embedder.close()
        encoder.close()
    return {"load_s": round(load_s, 2), "points": {"1": point}}


def policy_variant(policy: str, folder: Path, *, cache: bool, pinned: bool = True) -> str:
    """A copy of ``policy`` with the feature cache off (cold figures are not a cache
    benchmark) and, unless ``pinned``, the runtime pins removed (the scheduler places each
    stage on whichever device measures faster)."""
    from hetero.framework.policy import builtin_policy_text

    name = policy.removeprefix("builtin:")
    text = builtin_policy_text(name) if policy.startswith("builtin:") else Path(policy).read_text()
    data = yaml.safe_load(text)
    data["cache"] = {**data.get("cache", {}), "enabled": cache}
    if not pinned:
        data.get("server", {}).pop("runtimes", None)
    suffix = ("" if cache else "-nocache") + ("" if pinned else "-free")
    target = folder / f"{name}{suffix}.yaml"
    target.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(target)


def _warm(url: str) -> None:
    """A few requests of each kind, so idle memory is measured with both models exercised."""
    mix = RequestMix(new_nonce())
    stream = mix.stream(0)
    seen: dict[str, int] = {}
    with httpx.Client(base_url=url, timeout=60.0, trust_env=False) as client:
        while min(seen.get("/embed", 0), seen.get("/vision", 0)) < 3:
            request = next(stream)
            response = client.post(
                request.route, content=request.body, headers={"content-type": "application/json"}
            )
            response.raise_for_status()
            seen[request.route] = seen.get(request.route, 0) + 1


@dataclass(slots=True)
class _Running:
    """A stack's server, up, and what was measured of it."""

    label: str
    url: str
    process: subprocess.Popen[bytes]
    ready_path: str
    out: dict[str, Any]
    rounds: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)


def _launch(args: list[str], ready_path: str, logs: Path, label: str) -> _Running:
    """Start a stack and wait until it is ready (start-up and idle memory are its own)."""
    port = bench_procs.free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [a.replace("{port}", str(port)) for a in args]
    process, out = bench_procs.launch(
        argv[0], argv[1:], logs / f"{label}.log", url, ready_path, READY_TIMEOUT_S, _warm, label
    )
    return _Running(label, url, process, ready_path, out)


def _point(stack: _Running, mode: str, workers: int, seconds: float) -> dict[str, Any]:
    share = REPEAT_SHARE if mode == "repeated" else 0.0
    mix = RequestMix(new_nonce(), repeat_share=share)
    return closed_loop(stack.url, mix, workers, warmup_s=_warmup_s(seconds), seconds=seconds)


def _interleaved(
    plan: Sequence[tuple[_Running, str]],
    concurrency: Sequence[int],
    seconds: float,
    rounds: int,
    progress: Progress,
) -> None:
    """Measure every (stack, mode) of ``plan`` at every concurrency, side by side: per round
    and concurrency each in turn, the order rotated each round; a point is its median round
    (a load that drifts over the run falls on every stack alike)."""
    for round_index in range(rounds):
        shift = round_index % len(plan)
        for workers in concurrency:
            for stack, mode in [*plan[shift:], *plan[:shift]]:
                progress(f"round {round_index + 1}: {stack.label} {mode} at concurrency {workers}")
                point = _point(stack, mode, workers, seconds)
                stack.rounds.setdefault((mode, workers), []).append(point)
    for stack, mode in plan:
        stack.out[mode] = {
            str(workers): median_point(stack.rounds[(mode, workers)]) for workers in concurrency
        }


def _finish(stack: _Running) -> None:
    """What a stack holds after its load, and where each stage ran."""
    stack.out["rss_after_load_mb"] = bench_procs.tree_rss_mb(stack.process.pid)
    if stack.ready_path == "/ready":
        with httpx.Client(base_url=stack.url, timeout=10.0, trust_env=False) as client:
            stack.out["stages"] = client.get("/v1/devices").json().get("stages", [])


def _isolation(url: str, seconds: float, heavy_clients: int) -> dict[str, Any]:
    """The light route's latency alone, then while ``heavy_clients`` saturate the heavy one."""
    warmup = _warmup_s(seconds)
    alone = closed_loop(
        url, RequestMix(new_nonce(), embed_share=1.0), 1, warmup_s=warmup, seconds=seconds
    )
    loaded = closed_loop_groups(
        url,
        [
            (RequestMix(new_nonce(), embed_share=0.0), heavy_clients),
            (RequestMix(new_nonce(), embed_share=1.0), 1),
        ],
        warmup_s=warmup,
        seconds=seconds,
    )
    return {
        "heavy_clients": heavy_clients,
        "embed_alone": alone["routes"]["embed"],
        "embed_under_load": loaded["routes"]["embed"],
        "vision_under_load": loaded["routes"]["vision"],
    }


def run_serve_bench(
    seconds: float = 5.0,
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
    *,
    policy: str = POLICY,
    baseline_threads: int | None = None,
    rounds: int = 1,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Measure every stack and return the report (figures, ratios, goals); see the module doc.

    The stacks start one at a time and then all stay up while the points are measured
    interleaved over ``rounds`` (:func:`_interleaved`); the isolation scenario follows."""
    if rounds < 1:
        raise ValueError(f"rounds: a positive count, got {rounds}")
    report = progress or (lambda message: None)
    threads = baseline_threads or os.cpu_count() or 1
    stacks: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hetero-bench-serve-") as directory:
        logs = Path(directory)
        report("in-process loop: concurrency 1")
        stacks["inprocess"] = _inprocess(seconds, threads)
        fastapi_args = [bench_procs.MODULE, "fastapi", "--port", "{port}"]
        fastapi_args += ["--threads", str(threads)]
        running: list[_Running] = []
        try:
            report("fastapi: starting")
            running.append(_launch(fastapi_args, "", logs, "fastapi"))
            for label, variant in (
                ("hetero", policy_variant(policy, logs, cache=False)),
                ("hetero_cache", policy),
                ("hetero_free", policy_variant(policy, logs, cache=False, pinned=False)),
            ):
                report(f"{label}: starting")
                args = [bench_procs.CLI_MODULE, "serve", "--policy", variant, "--port", "{port}"]
                # warm-up timings of this run's own (a user's kept figures neither help nor hurt)
                with environment("HETERO_CALIBRATION_FILE", str(logs / "calibration.json")):
                    running.append(_launch(args, "/ready", logs, label))
            fastapi, hetero, cached, free = running
            plan = [
                (fastapi, "points"),
                (hetero, "points"),
                (hetero, "repeated"),
                (cached, "repeated"),
                (free, "points"),
            ]
            _interleaved(plan, concurrency, seconds, rounds, report)
            for stack in (fastapi, hetero):
                report(f"{stack.label}: isolation ({max(concurrency)} vision clients + 1 embed)")
                stack.out["isolation"] = _isolation(stack.url, seconds, max(concurrency))
            for stack in running:
                _finish(stack)
                stacks[stack.label] = stack.out
        finally:
            with contextlib.ExitStack() as stopping:  # each is stopped even if one stop fails
                for stack in running:
                    stopping.callback(bench_procs.stop, stack.process)
    report("engine: per-request overhead, no model")
    overhead = engine_overhead()
    result: dict[str, Any] = {
        "seconds": seconds,
        "rounds": rounds,
        "warmup_s": _warmup_s(seconds),
        "concurrency": list(concurrency),
        "repeat_share": REPEAT_SHARE,
        "baseline_threads": threads,
        "policy": policy,
        "cpus": os.cpu_count(),
        "stacks": stacks,
        "engine_overhead_us": overhead,
    }
    result["ratios"], result["goals"] = ratios(stacks, list(concurrency))
    p99 = overhead["p99_us"]
    result["goals"]["engine overhead per request, p99 us (no model)"] = {
        "value": p99,
        "goal": "< 400",
        "met": _met(p99, "< 400"),
    }
    further = overhead["further_stage_us"]
    result["goals"]["each further stage of a graph, us (p50 difference, no model)"] = {
        "value": further,
        "goal": "< 150",
        "met": _met(further, "< 150"),
    }
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return result


def _div(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    return round(float(a) / float(b), 2)


def ratios(stacks: dict[str, Any], concurrency: list[int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ratios the goals are read against, and each goal with its measured value.

    ``hetero`` runs with the feature cache off (cold figures), ``hetero_cache`` with it on
    (30 % repeated content), ``hetero_free`` cache off and unpinned (placement by measurement).
    """
    hetero, fastapi = stacks["hetero"], stacks["fastapi"]
    cached, free = stacks.get("hetero_cache"), stacks.get("hetero_free")
    low, high = str(min(concurrency)), str(max(concurrency))
    mid = "8" if 8 in concurrency else str(sorted(concurrency)[len(concurrency) // 2])
    out: dict[str, Any] = {"at": {"low": low, "mid": mid, "high": high}}
    for c in map(str, concurrency):
        h, f = hetero["points"][c], fastapi["points"][c]
        out[f"c{c}_throughput_hetero_vs_fastapi"] = _div(h["req_s"], f["req_s"])
        out[f"c{c}_p99_hetero_vs_fastapi"] = _div(h["p99_ms"], f["p99_ms"])
        if cached is not None:
            out[f"c{c}_repeated_hetero_vs_fastapi"] = _div(
                cached["repeated"][c]["req_s"], f["req_s"]
            )
        if free is not None:
            out[f"c{c}_free_placement_vs_fastapi"] = _div(free["points"][c]["req_s"], f["req_s"])
    for name, stack in (("hetero", hetero), ("fastapi", fastapi)):
        embed_high = stack["points"][high]["routes"]["embed"]["p99_ms"]
        embed_low = stack["points"][low]["routes"]["embed"]["p99_ms"]
        out[f"{name}_embed_p99_c{high}_vs_c{low}"] = _div(embed_high, embed_low)
        isolation = stack["isolation"]
        out[f"{name}_light_p99_under_heavy_vs_alone"] = _div(
            isolation["embed_under_load"]["p99_ms"], isolation["embed_alone"]["p99_ms"]
        )
    out[f"c{mid}_throughput_hetero_vs_ray_reference"] = _div(
        hetero["points"][mid]["req_s"], RAY_SERVE_C8_REQ_S
    )
    goals: dict[str, tuple[Any, str]] = {
        f"c{low} throughput >= FastAPI": (
            out[f"c{low}_throughput_hetero_vs_fastapi"],
            ">= 1.0",
        ),
        f"c{mid} throughput >= 1.05x FastAPI": (
            out[f"c{mid}_throughput_hetero_vs_fastapi"],
            ">= 1.05",
        ),
        f"c{mid} p99 <= 1.1x FastAPI": (out[f"c{mid}_p99_hetero_vs_fastapi"], "<= 1.1"),
        f"c{high} throughput >= 1.1x FastAPI": (
            out[f"c{high}_throughput_hetero_vs_fastapi"],
            ">= 1.1",
        ),
        f"c{mid} throughput >= 1.8x Ray Serve (peers' figure)": (
            out[f"c{mid}_throughput_hetero_vs_ray_reference"],
            ">= 1.8",
        ),
        f"light (embed) p99 with {high} clients saturating vision / alone": (
            out["hetero_light_p99_under_heavy_vs_alone"],
            "<= 3.0",
        ),
        "idle RSS MB": (hetero["idle_rss_mb"], "< 400"),
        "start-up s": (hetero["startup_s"], "< 3"),
    }
    if cached is not None:
        goals[f"30% repeated, c{mid} throughput vs FastAPI"] = (
            out[f"c{mid}_repeated_hetero_vs_fastapi"],
            ">= 1.5",
        )
        if "repeated" in hetero:  # the same repeated load with the cache off, side by side
            off = hetero["repeated"][mid]
            on = cached["repeated"][mid]
            out[f"c{mid}_repeated_cache_on_vs_off"] = _div(on["req_s"], off["req_s"])
            out[f"c{mid}_repeated_p99_cache_on_vs_off"] = _div(on["p99_ms"], off["p99_ms"])
            goals[f"30% repeated, c{mid} throughput, cache on vs off"] = (
                out[f"c{mid}_repeated_cache_on_vs_off"],
                ">= 1.35",
            )
            goals[f"30% repeated, c{mid} p99, cache on vs off"] = (
                out[f"c{mid}_repeated_p99_cache_on_vs_off"],
                "<= 1.0",
            )
    if free is not None:
        goals[f"free placement, c{mid} throughput vs FastAPI on ONNX Runtime"] = (
            out[f"c{mid}_free_placement_vs_fastapi"],
            ">= 1.2",
        )
    return out, {
        name: {"value": value, "goal": goal, "met": _met(value, goal)}
        for name, (value, goal) in goals.items()
    }


def _met(value: Any, goal: str) -> bool | None:
    if not isinstance(value, int | float):
        return None
    op, bound = goal.split()
    limit = float(bound)
    return {">=": value >= limit, "<=": value <= limit, "<": value < limit}[op]
