"""Streamed LLM generation in the Ray mode against the single-process engine: time to the first
piece and to the last, the same model (SmolLM2-135M on the torch CPU device), the same greedy
request, c=1, the two engines' requests interleaved in one run. Run with the Ray venv:
``make bench-ray-stream`` (one local Ray node on loopback, started and shut down here).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from hetero.framework.engine import Engine
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import default_registry
from hetero.framework.stage_plugin import Generation

DEVICE = "npu:torch/cpu"
POLICY = """\
version: 1
devices: {{allow: [npu]}}
{cluster}
server: {{runtimes: {{llm_generate: torch}}}}
stages:
  llm_generate:
    modality: text
    model_version: smollm2-135m-instruct@1
    variants: {{full: {{batchable: false, max_batch: 1}}}}
routes: {{}}
qos:
  default_class: standard
  classes: {{standard: {{weight: 1, sla_tier: t}}}}
sla_tiers: {{t: {{deadline_ms: 600000}}}}
cache: {{enabled: false}}
"""
QUESTION = [{"role": "user", "content": "Name three colours and say why you like them."}]


def engine_for(cluster: str) -> Engine:
    from hetero.models.llm import TextGenerator

    policy = load_policy_text(POLICY.format(cluster=cluster), "stream.yaml")
    engine = Engine(
        policy,
        default_registry(),
        {},
        plugins={"llm_generate": TextGenerator()},
        pinned=dict(policy.spec.server.runtimes),
        probe=False,
    )
    engine.start()
    failed = engine.warm_up()
    if failed:
        raise SystemExit(f"warm-up failed: {failed}")
    return engine


def one(engine: Engine, max_tokens: int) -> tuple[float, float, int]:
    """Seconds to the first piece and to the answer, and the pieces."""
    began = time.perf_counter()
    firsts: list[float] = []

    def on_piece(piece: str) -> None:
        firsts.append(time.perf_counter())

    job = Generation(QUESTION, max_tokens, on_piece=on_piece)
    engine.submit_stage("llm_generate", job).result()
    return firsts[0] - began, time.perf_counter() - began, len(firsts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10, help="per engine")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    import ray

    ray.init(
        num_cpus=1,
        resources={f"hetero/{DEVICE}": 1},
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    try:
        engines = {"embedded": engine_for(""), "ray": engine_for("cluster: {engine: ray}")}
        for engine in engines.values():
            one(engine, args.max_tokens)  # the first generation warms the caches up
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"ray {ray.__version__}; c=1, {args.requests} generations per engine; load {load}")
        runs: dict[str, list[tuple[float, float, int]]] = {k: [] for k in engines}
        for _ in range(args.requests):
            for label, engine in engines.items():
                runs[label].append(one(engine, args.max_tokens))
        print(
            f"{'engine':<10}{'first piece p50':>17}{'answer p50':>12}{'per piece':>11}{'pieces':>8}"
        )
        for label, got in runs.items():
            first = statistics.median(r[0] for r in got) * 1e3
            total = statistics.median(r[1] for r in got) * 1e3
            pieces = statistics.median(r[2] for r in got)
            per = statistics.median((r[1] - r[0]) / max(1, r[2] - 1) for r in got) * 1e3
            print(f"{label:<10}{first:>14.1f} ms{total:>9.1f} ms{per:>8.2f} ms{pieces:>8.0f}")
        print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        for engine in engines.values():
            engine.close()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
