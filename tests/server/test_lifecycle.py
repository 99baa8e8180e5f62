"""Lanes and shutdown: a heavy stage's lanes can run at a lower CPU priority (``server.nice``);
closing while models load or while a generation runs releases everything and ends the run."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from fakes import FAKE_STAGES

from hetero.framework.conformance.reference_graphs import reference_graphs
from hetero.framework.engine import Engine
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.policy import Policy, load_policy, load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.server import Serving
from hetero.framework.stage_plugin import Generation, GraphRunner, StagePlugin

ONE_STAGE = """version: 1
stages:
  vision_encode:
    modality: image
    variants:
      full: {flops_per_item: 1 GFLOPS, bytes_per_item: 1 MB}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: silver}}
sla_tiers: {silver: {deadline_ms: 60000}}
cache: {enabled: false}
"""


class PriorityProbe(StagePlugin):
    """Reports the CPU priority of the thread that runs it (no model)."""

    name = "vision_encode"

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        return {}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        return [os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) for _ in payloads]


def _priority_of_lane(nice: int) -> int:
    policy = load_policy_text(ONE_STAGE, "one-stage.yaml")
    engine = Engine(
        policy, Registry(), plugins={"vision_encode": PriorityProbe()}, nice={"vision_encode": nice}
    )
    with engine:
        engine.warm_up()
        result = engine.submit_stage("vision_encode", b"x").result(timeout=30)
        return int(result.outputs["vision_encode"])


def test_a_stage_with_nice_runs_its_model_calls_at_lower_priority() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert _priority_of_lane(0) == base  # the control: unchanged without the setting
    assert _priority_of_lane(10) == 10
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the server's own threads keep theirs


def test_closing_while_models_load_releases_every_model_loaded() -> None:
    entered, release = threading.Event(), threading.Event()
    mlp = reference_graphs()["mlp"].graph

    class SlowEmbed(FAKE_STAGES["text_embed"]):  # type: ignore[misc, valid-type]
        def graphs(
            self, variant: str = "full", graph_format: GraphFormat | None = None
        ) -> Mapping[str, ComputeGraph]:
            return {"mlp": mlp}  # a real graph to load, so a leak would show

        def setup(self) -> None:
            entered.set()
            assert release.wait(30)

    registry = Registry()  # its own npu backend: its loaded models are this test's alone
    stages = {**FAKE_STAGES, "text_embed": SlowEmbed}
    runtime = Serving(
        load_policy("builtin:default"),
        stage_models=stages,
        registry=registry,
        use_cache=False,
        probe_runtimes=False,
    )
    loader = threading.Thread(target=runtime.start)
    loader.start()
    assert entered.wait(30)
    runtime.close()  # while text_embed is still loading
    release.set()
    loader.join(30)
    assert not loader.is_alive() and not runtime.ready
    assert registry.backend("npu").loaded_models() == ()


def _llm_policy(devices: str = "") -> Policy:
    text = ONE_STAGE.replace("vision_encode:", "llm_generate:").replace("image", "text")
    return load_policy_text(text + devices, "llm.yaml")


def test_close_stops_a_running_generation_before_the_model_is_released() -> None:
    started = threading.Event()
    ended: list[bool] = []

    class EndlessLlm(FAKE_STAGES["llm_generate"]):  # type: ignore[misc, valid-type]
        def one(self, variant: str, payload: Any) -> Any:
            started.set()
            ended.append(payload.stop.wait(60))  # a generation that only ends when asked to
            return {"text": "", "completion_tokens": 0, "finish_reason": "stop", "stopped": True}

    engine = Engine(_llm_policy(), Registry(), plugins={"llm_generate": EndlessLlm()})
    engine.start()
    engine.warm_up()
    future = engine.submit_stage("llm_generate", Generation([], max_tokens=8))
    assert started.wait(30)
    engine.close()
    assert ended == [True]  # asked to stop, and it did, before close() returned
    assert future.done()


def test_a_generation_refused_at_submission_leaves_no_unretrieved_future() -> None:
    """A chat refused when it is queued (429) is raised to the route; its summary future must
    not also be logged as "Future exception was never retrieved" (it was, once per 429)."""
    import asyncio
    import gc

    from hetero.framework.errors import ShedError
    from hetero.framework.server.auth import ANONYMOUS, Caller

    runtime = Serving(_llm_policy(), stage_models={"llm_generate": FAKE_STAGES["llm_generate"]})
    runtime.start()
    unretrieved: list[dict[str, Any]] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ShedError("queue full", status=429, retry_after_s=2.0)

    async def chat() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: unretrieved.append(ctx))
        caller = Caller(ANONYMOUS, "standard", "silver", anonymous=True)
        try:
            await runtime.calls.generate(
                [{"role": "user", "content": "hi"}], caller=caller, max_tokens=4
            )
        except ShedError:
            pass
        else:
            raise AssertionError("the generation was not refused")
        for _ in range(3):  # let the submission's callbacks run
            await asyncio.sleep(0)
        gc.collect()  # an unretrieved future reports itself when it is collected

    try:
        assert runtime.engine is not None
        runtime.engine.submit_graph = refuse  # type: ignore[method-assign]
        asyncio.run(chat())
    finally:
        runtime.close()
    assert unretrieved == []


def test_a_burst_of_generations_is_admitted_while_it_can_meet_its_deadline() -> None:
    """16 chats at once on a one-at-a-time LLM, each measured at 5 s, 60 s deadline: the
    engine admits the 12 that can finish in time behind the queue and sheds the other 4 at
    once, with the Retry-After that says when one would fit (it used to queue all 16)."""
    from hetero.framework.errors import ShedError
    from hetero.framework.request_profile import RequestProfile

    release = threading.Event()

    class HeldLlm(FAKE_STAGES["llm_generate"]):  # type: ignore[misc, valid-type]
        def one(self, variant: str, payload: Any) -> Any:
            release.wait(60)  # nothing finishes while the burst arrives
            return {"text": "", "completion_tokens": 0, "finish_reason": "stop", "stopped": False}

    one_device = 'devices: {allow: ["npu:onnxruntime/CPUExecutionProvider"]}\n'
    policy = _llm_policy(one_device)  # one device: the queue drains one generation at a time
    engine = Engine(policy, Registry(), plugins={"llm_generate": HeldLlm()}, probe=False)
    engine.start()
    try:
        engine.warm_up()
        pace = engine.admission.pace("llm_generate")
        pace.item_s, pace.unit_s = 5.0, 25.0  # 5 s a generation; 100 tokens (0.1 unit) 2.5 s
        admitted, refused = [], []
        for _ in range(16):
            try:
                engine.admit("llm_generate", None, RequestProfile(text_tokens=100))
            except ShedError as err:
                refused.append(err)
                continue
            admitted.append(engine.submit_stage("llm_generate", Generation([], max_tokens=64)))
        # the n-th waits for n generations of 5 s, then runs 2.5 s: n <= 11 fit in 60 s
        assert (len(admitted), len(refused)) == (12, 4)
        assert all(err.status == 429 and "deadline" in str(err) for err in refused)
        assert [err.retry_after_s for err in refused] == [2.5] * 4  # 12 x 5 + 2.5 - 60
    finally:
        release.set()
        engine.close()
