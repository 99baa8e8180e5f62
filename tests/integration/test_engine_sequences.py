"""The engine places and admits generations as the simulator does (issue 36): a generation's
task carries the KV cache its plugin says it holds (prompt plus the output length learnt from
the stage's finished generations), each finished one is timed against its placement's
prediction, and admission is given the sequence it would place. The plugin is a test double
that generates nothing: it answers a length, as a generation's result does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hetero.framework.engine import Engine, GraphNode, RequestGraph
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.scheduler import StageTask
from hetero.framework.stage_plugin import GraphRunner, StagePlugin

POLICY = """version: 1
stages:
  chat:
    modality: text
    variants:
      full: {flops_per_item: 1 MFLOPS, bytes_per_item: 1 KB, kv_bytes_per_token: 1 KB,
             batchable: false}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: silver}}
sla_tiers: {silver: {deadline_ms: 60000}}
cache: {enabled: false}
"""
PROMPT = 40  # tokens of every prompt here


class Lengths(StagePlugin):
    """A 'generation' of the payload's length: ``{"completion_tokens": n}``; its KV cache is
    the prompt plus the output, as an LLM plugin's."""

    name = "lengths"

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        return {}

    def kv_tokens(self, payload: Any, output_tokens: int) -> int:
        return PROMPT + output_tokens

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        return [{"completion_tokens": int(n)} for n in payloads]


def _generate(engine: Engine, tokens: int) -> None:
    graph = RequestGraph("chat", {"chat": GraphNode("chat", payload=tokens)})
    engine.submit_graph(graph).result(timeout=30)


def test_a_generation_is_placed_with_its_kv_cache_and_timed_when_it_ends() -> None:
    enqueued: list[StageTask] = []
    with Engine(
        load_policy_text(POLICY, "chat.yaml"), Registry(), plugins={"chat": Lengths()}
    ) as engine:
        engine.warm_up()
        scheduler = engine.scheduler
        # its graphs' cost, as an LLM plugin's says: a KV cache per token (this double has
        # no graphs, so warm-up gave it an empty hint)
        hint = BandwidthHint(1e6, 1e3, kv_bytes_per_token=1024, batchable=False)
        scheduler.set_hint("chat", "full", hint)
        enqueue = scheduler.enqueue

        def recorded(task: StageTask) -> None:
            enqueued.append(task)
            enqueue(task)

        scheduler.enqueue = recorded  # type: ignore[method-assign]
        _generate(engine, 100)  # nothing finished yet: no length learnt, the prompt's KV
        assert (enqueued[0].output_tokens, enqueued[0].kv_tokens) == (0, PROMPT)
        assert scheduler.output_lengths.expected("chat") == 100
        _generate(engine, 100)
        assert (enqueued[1].output_tokens, enqueued[1].kv_tokens) == (100, PROMPT + 100)
        # placed by the completion it adds, and timed against that prediction when it ended
        assert scheduler.output_lengths.times._seen.get("chat") == 1
        sequence = engine.runner.walk.sequence("chat", 100, "standard")
        assert sequence is not None and sequence.kv_tokens == PROMPT + 100
        # the control: without a KV cache in its hint, a stage has no sequence to judge
        scheduler.set_hint("chat", "full", BandwidthHint(1e6, 1e3, batchable=False))
        assert engine.runner.walk.sequence("chat", 100, "standard") is None
