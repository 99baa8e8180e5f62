"""The engine's own cost per request: submit to result through the scheduler and a lane, with
a plugin that runs no model, on this host's ONNX Runtime CPU device."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.stage_plugin import GraphRunner, StagePlugin

__all__ = ["engine_overhead"]

POLICY = """version: 1
name: engine-overhead
stages:
  echo:
    modality: text
    variants:
      full: {flops_per_item: 1, bytes_per_item: 1}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: silver}}
sla_tiers: {silver: {deadline_ms: 60000}}
devices: {allow: ["npu:onnxruntime/CPUExecutionProvider"]}
"""


class _Echo(StagePlugin):
    """Gives each payload back: the engine's path with nothing behind it."""

    name = "echo"

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        return {}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        return list(payloads)


def engine_overhead(requests: int = 3000, warmup: int = 300) -> dict[str, float]:
    """p50, p99 and mean microseconds from submitting a one-step request graph to its result,
    one at a time; and what each further step of a graph adds (a chain of three steps against
    one, at the p50, measured in the same engine)."""
    from hetero.framework.engine import Engine

    policy = load_policy_text(POLICY, "engine-overhead")
    with Engine(policy, Registry(), plugins={"echo": _Echo()}) as engine:
        engine.warm_up()
        single = _timed(engine, 1, requests, warmup)
        chain = _timed(engine, CHAIN, requests // 2, warmup)
    return {
        "requests": requests,
        "p50_us": round(single[len(single) // 2] * 1e6, 1),
        "p99_us": round(single[int(0.99 * len(single))] * 1e6, 1),
        "mean_us": round(sum(single) / len(single) * 1e6, 1),
        "further_stage_us": round(
            (chain[len(chain) // 2] - single[len(single) // 2]) / (CHAIN - 1) * 1e6, 1
        ),
    }


CHAIN = 3  # steps of the chained graph that tells what each further step adds


def _timed(engine: Any, steps: int, requests: int, warmup: int) -> list[float]:
    """Sorted seconds per request of a chain of ``steps`` echo steps."""
    from hetero.framework.engine import GraphNode, RequestGraph

    def graph(index: int) -> RequestGraph:
        names = ["echo", *(f"echo{n}" for n in range(1, steps))]  # one step: as submit_stage
        nodes = {"echo": GraphNode("echo", payload=index)}
        for before, name in itertools.pairwise(names):
            nodes[name] = GraphNode(
                "echo", after=(before,), compose=lambda done: next(iter(done.values()))
            )
        return RequestGraph("echo", nodes)

    for index in range(warmup):
        engine.submit_graph(graph(index)).result(timeout=10)
    samples = []
    for index in range(requests):
        began = time.perf_counter()
        engine.submit_graph(graph(index)).result(timeout=10)
        samples.append(time.perf_counter() - began)
    return sorted(samples)
