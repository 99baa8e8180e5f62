"""The engine learns how long its generations are from the results it gives (their
``completion_tokens``) and hands the expectation to placement on the next tasks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hetero.framework.engine import Engine
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.stage_plugin import GraphRunner, StagePlugin

POLICY = """version: 1
stages:
  gen: {modality: text, variants: {full: {flops_per_item: 1 MFLOPS, bytes_per_item: 1 KB}}}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: silver}}
sla_tiers: {silver: {deadline_ms: 60000}}
devices: {allow: ["npu:onnxruntime/CPUExecutionProvider"]}
cache: {enabled: false}
"""


class Counting(StagePlugin):
    """A stand-in generation: answers ``payload`` tokens, as a text stage's result does."""

    name = "gen"

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        return {}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        return [{"text": "x" * n, "completion_tokens": n} for n in payloads]


def test_generations_lengths_are_learnt_and_given_to_the_next_tasks() -> None:
    with Engine(
        load_policy_text(POLICY, "gen.yaml"), Registry(), plugins={"gen": Counting()}
    ) as engine:
        engine.warm_up()
        seen: list[int] = []
        enqueue = engine.scheduler.enqueue

        def recording(task: Any) -> Any:
            seen.append(task.output_tokens)
            return enqueue(task)

        engine.scheduler.enqueue = recording  # type: ignore[method-assign]
        for tokens in (10, 30):
            engine.submit_stage("gen", tokens).result(timeout=30)
        engine.submit_stage("gen", 5).result(timeout=30)
    assert seen == [0, 10, 20]  # nothing known, then the mean of those that finished
