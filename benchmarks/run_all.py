"""`make bench`: figures, not pass/fail. Each benchmark prints ratios measured side by side.

Scheduler: decision latency of hetero's scheduler against a naive rescan-and-sort reference at
100, 1,000 and 10,000 queued tasks, on 64 and on 1,000 devices (``hetero bench scheduler
[--devices 1000]``).

Fleet growth: scheduler construction, ``hetero plan``, ``hetero devices --policy --json`` and
``hetero simulate`` on 16, 128 and 1,000 simulated A100s, with the growth from 16 to 1,000
(``framework/bench/fleet.py``).

Scenarios: ref-8xa100, thrash, mixed-fleet and azure-conv simulated under every placement
policy on identical arrivals (``benchmarks/scenarios/run.py``); tables, JSON and plots go to
``results/scenarios/<name>/``.

Tuning: ``hetero tune`` on the mixed-fleet scenario (60 trials, two at a time, screened on 10 s
after the warm-up, the three best judged on the whole workload), its before/after table and its
wall time; the tuned policy goes to ``results/tune/mixed-fleet.tuned.yaml``.

Serving: hetero's server against an in-process loop and a plain FastAPI baseline on the same
models and a 70/30 embed/vision closed-loop load (``hetero bench serve``); the JSON report goes
to ``results/serve.json``.

Chat with an image: hetero's one request graph (vision and OCR together, then the LLM) against
the same stages one after another in process, at concurrency 1, the p50 ratio and each stage's
p50 (``benchmarks/chat_image_overlap.py``).

npu runtimes: the same reference graphs on OpenVINO (f32) and ONNX Runtime (CPU provider),
interleaved in one run so machine noise hits both; the ratio is OpenVINO's median latency over
ONNX Runtime's.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from hetero.backends.npu import NpuBackend
from hetero.framework.conformance.reference_graphs import reference_graphs

REPEATS = 200
DEVICES = ("npu:openvino/CPU", "npu:onnxruntime/CPUExecutionProvider")


def bench_npu_runtimes() -> None:
    """Median run latency per reference graph on both runtimes, and their ratio."""
    backend = NpuBackend()
    print(f"{'graph':<16}{'openvino':>14}{'onnxruntime':>14}{'ov/ort':>9}")
    for name, ref in reference_graphs().items():
        models = [backend.load(backend.compile(ref.graph, device)) for device in DEVICES]
        samples: list[list[float]] = [[], []]
        for _ in range(REPEATS):
            for index, model in enumerate(models):
                started = time.perf_counter()
                backend.run(model, ref.inputs)
                samples[index].append(time.perf_counter() - started)
        ov, ort = (statistics.median(s) for s in samples)
        print(f"{name:<16}{ov * 1e6:>11.1f} us{ort * 1e6:>11.1f} us{ov / ort:>9.2f}")
        for model in models:
            backend.unload(model)


def bench_scheduler() -> None:
    """Scheduling decision latency against the naive reference (``hetero bench scheduler``)."""
    from rich.console import Console

    from hetero.framework.bench.report import run_bench_scheduler
    from hetero.framework.bench.scheduler import FLEET_SIZES

    for devices in FLEET_SIZES:
        run_bench_scheduler(Console(), as_json=False, devices=devices)


def bench_fleet() -> None:
    """How construction, plan, devices and simulate grow from 16 to 1,000 devices."""
    from hetero.framework.bench.fleet import run_fleet_bench

    result = run_fleet_bench()
    print(
        f"{'devices':>8}{'hosts':>7}{'fleet':>8}{'construct':>11}{'memory':>10}{'plan':>8}"
        f"{'devices':>9}{'simulate':>10}{'requests/s':>12}"
    )
    for row in result["fleets"]:
        print(
            f"{row['devices']:>8,}{row['hosts']:>7}{row['fleet_s']:>7.2f}s{row['construct_s']:>10.3f}s"
            f"{row['construct_mib']:>7.1f} MiB{row['plan_s']:>7.2f}s{row['devices_s']:>8.2f}s"
            f"{row['simulate_s']:>9.2f}s{row['requests_per_s']:>12,.0f}"
        )
    growth = ", ".join(f"{k} {v:.2f}x" for k, v in result["growth"].items())
    print(f"growth from {result['from']} to {result['to']:,} devices: {growth}")


def bench_scenarios() -> None:
    """The four simulator scenarios; tables and plots under results/scenarios/."""
    import runpy
    from pathlib import Path

    runner = runpy.run_path(str(Path(__file__).parent / "scenarios" / "run.py"))
    runner["main"]([])


def bench_tune() -> None:
    """``hetero tune`` on the mixed-fleet scenario: p99 before and after, and its wall time."""
    from pathlib import Path

    from rich.console import Console

    from hetero.framework.cli.tune import run_tune
    from hetero.framework.registry import Registry

    root = Path(__file__).resolve().parent.parent
    out = root / "results" / "tune" / "mixed-fleet.tuned.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    run_tune(
        Console(),
        Console(stderr=True),
        Registry(use_entry_points=False),
        str(root / "policies" / "sim" / "mixed-fleet.yaml"),
        str(root / "benchmarks" / "scenarios" / "mixed-fleet" / "workload.yaml"),
        str(out),
        trials=60,
        seed=1,
        timeout_s=None,
        search_s=10.0,
        finalists=3,
        jobs=2,
    )
    print(f"hetero tune: {time.perf_counter() - started:.0f} s of wall time")


def bench_cache() -> None:
    """Feature cache tiers against raw redis-py and LMDB reads (``hetero bench cache``)."""
    from rich.console import Console

    from hetero.framework.bench.report import run_bench_cache

    run_bench_cache(Console(), as_json=False)


def bench_serve() -> None:
    """Serving figures against an in-process loop and FastAPI (``hetero bench serve``)."""
    import json
    from pathlib import Path

    from rich.console import Console

    from hetero.framework.bench.serve import run_serve_bench
    from hetero.framework.bench.serve_report import print_report

    result = run_serve_bench(rounds=3, progress=print)
    target = Path(__file__).resolve().parent.parent / "results" / "serve.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print_report(Console(), result)
    print(f"wrote {target}")


def bench_chat_image() -> None:
    """A chat with an image: one request graph against its stages one after another."""
    import runpy

    runpy.run_path(str(Path(__file__).with_name("chat_image_overlap.py")), run_name="__main__")


if __name__ == "__main__":
    bench_npu_runtimes()
    bench_scheduler()
    bench_fleet()
    bench_cache()
    bench_serve()
    bench_chat_image()
    bench_scenarios()
    bench_tune()
