"""The engine's own cost per request: submit to result through the scheduler and a lane, with
a plugin that runs no model, on this host's ONNX Runtime CPU device."""

from __future__ import annotations

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
    """p50, p99 and mean microseconds from ``submit_stage`` to the result, one at a time."""
    from hetero.framework.engine import Engine

    policy = load_policy_text(POLICY, "engine-overhead")
    with Engine(policy, Registry(), plugins={"echo": _Echo()}) as engine:
        engine.warm_up()
        for index in range(warmup):
            engine.submit_stage("echo", index).result(timeout=10)
        samples = []
        for index in range(requests):
            began = time.perf_counter()
            engine.submit_stage("echo", index).result(timeout=10)
            samples.append(time.perf_counter() - began)
    samples.sort()
    return {
        "requests": requests,
        "p50_us": round(samples[len(samples) // 2] * 1e6, 1),
        "p99_us": round(samples[int(0.99 * len(samples))] * 1e6, 1),
        "mean_us": round(sum(samples) / len(samples) * 1e6, 1),
    }
