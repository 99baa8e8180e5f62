"""Request graphs through the real engine (placement, lanes, admission, queues) on this host's
devices: steps of a level run together, a step's input is composed from its dependencies'
outputs, the feature cache answers first steps before admission, and a step whose input
cannot be composed ends its request, not the engine.

The stage plugins here are test doubles (they load no model: they return what they were
given), so the tests judge the engine's orchestration only."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from hetero.framework.engine import Engine, GraphNode, RequestGraph
from hetero.framework.errors import InvalidInputError
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.stage_plugin import GraphRunner, StagePlugin
from hetero.framework.stages import Pipeline

POLICY = """version: 1
stages:
  left: {modality: text, variants: {full: {flops_per_item: 1 MFLOPS, bytes_per_item: 1 KB}}}
  right: {modality: text, variants: {full: {flops_per_item: 1 MFLOPS, bytes_per_item: 1 KB}}}
  join: {modality: text, variants: {full: {flops_per_item: 1 MFLOPS, bytes_per_item: 1 KB}}}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: silver}}
sla_tiers: {silver: {deadline_ms: 60000}}
cache: {enabled: false}
"""


class Echo(StagePlugin):
    """Returns ``(its stage, the payload)``; ``running`` lists the stages that ran."""

    name = "echo"

    def __init__(self, stage: str, running: list[str]) -> None:
        self.stage = stage
        self.running = running

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        return {}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        self.running.append(self.stage)
        return [(self.stage, payload) for payload in payloads]


class DictStore:
    """A feature store in a dict (the protocol the server's cache adapter implements)."""

    def __init__(self) -> None:
        self.values: dict[Any, Any] = {}
        self.lookups = 0

    def lookup(self, stage: str, key: Any) -> tuple[Any, str | None]:
        self.lookups += 1
        value = self.values.get((stage, key))
        return (value, "memory") if value is not None else (None, None)

    def put(self, stage: str, key: Any, value: Any) -> None:
        self.values[(stage, key)] = value


@pytest.fixture
def engine() -> Any:
    running: list[str] = []
    plugins = {name: Echo(name, running) for name in ("left", "right", "join")}
    store = DictStore()
    with Engine(
        load_policy_text(POLICY, "graph.yaml"), Registry(), plugins=plugins, features=store
    ) as running_engine:
        running_engine.warm_up()
        yield running_engine, store, running


def _graph(compose: Any, key: str = "k") -> RequestGraph:
    return RequestGraph(
        "join-both",
        {
            "a": GraphNode("left", payload="x", cache_key=lambda variant, version: (key, variant)),
            "b": GraphNode("right", payload="y", answer=False),
            "c": GraphNode("join", after=("a", "b"), compose=compose),
        },
    )


def test_a_step_is_composed_from_its_dependencies_outputs(engine: Any) -> None:
    running_engine, _, _ = engine
    result = running_engine.submit_graph(_graph(lambda done: sorted(done.items()))).result(
        timeout=30
    )
    assert set(result.outputs) == {"a", "c"}  # b is not answered: it only fed c
    assert result.outputs["a"] == ("left", "x")
    assert result.outputs["c"] == ("join", [("a", ("left", "x")), ("b", ("right", "y"))])
    assert set(result.devices) == {"a", "b", "c"}
    assert {step.step for step in result.steps} == {"a", "b", "c"}
    queued = {step.step: step.queued_at for step in result.steps}
    ended = {s.step: s.started_at + s.load_s + s.run_s for s in result.steps}
    assert queued["c"] >= max(ended["a"], ended["b"])  # queued once both were done


def test_a_first_step_the_cache_answers_is_not_admitted_or_queued(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    running_engine, store, running = engine
    first = running_engine.submit_graph(_graph(lambda done: "joined")).result(timeout=30)
    assert first.cached == {}
    assert store.values  # the step with a key was filled after it ran
    admitted: list[str] = []
    admit = running_engine.admitter.admit

    def counting(stage: str, *args: Any, **kwargs: Any) -> Any:
        admitted.append(stage)
        return admit(stage, *args, **kwargs)

    monkeypatch.setattr(running_engine.admitter, "admit", counting)
    running.clear()
    again = running_engine.submit_graph(_graph(lambda done: "joined")).result(timeout=30)
    assert again.cached == {"a": "memory"}
    assert again.devices["a"] == "cache"
    assert again.outputs["a"] == ("left", "x")
    assert sorted(admitted) == ["join", "right"]  # the cache answered left before admission
    assert sorted(running) == ["join", "right"]


def test_a_step_whose_input_cannot_be_composed_ends_its_request_only(engine: Any) -> None:
    running_engine, _, _ = engine

    def refuse(done: Mapping[str, Any]) -> Any:
        raise InvalidInputError("the prompt is over the limit")

    with pytest.raises(InvalidInputError, match="over the limit"):
        running_engine.submit_graph(_graph(refuse, key="other")).result(timeout=30)
    after = running_engine.submit_graph(_graph(lambda done: "fine", key="third"))
    assert after.result(timeout=30).outputs["c"] == ("join", "fine")


def test_a_cycle_is_refused_before_anything_runs(engine: Any) -> None:
    running_engine, _, running = engine
    graph = RequestGraph(
        "loop",
        {
            "a": GraphNode("left", after=("b",), compose=lambda done: "a"),
            "b": GraphNode("right", after=("a",), compose=lambda done: "b"),
        },
    )
    with pytest.raises(ValueError, match="cycl"):
        running_engine.submit_graph(graph)
    assert running == []


def test_a_graph_shape_is_checked_once_and_a_cycle_every_time(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    running_engine, _, running = engine
    checked: list[str] = []
    post_init = Pipeline.__post_init__

    def counting(pipeline: Pipeline) -> None:
        checked.append(pipeline.name)
        post_init(pipeline)

    monkeypatch.setattr(Pipeline, "__post_init__", counting)
    for key in ("once-1", "once-2", "once-3"):
        running_engine.submit_graph(_graph(lambda done: "j", key=key)).result(timeout=30)
    assert checked.count("join-both") <= 1  # the shape's DAG was checked once, or before
    fresh = RequestGraph(  # the control: a shape not seen before is checked
        "fresh-shape",
        {"a": GraphNode("left", payload="x"), "c": GraphNode("join", after=["a"])},  # type: ignore[arg-type]
    )
    assert running_engine.submit_graph(fresh).result(timeout=30).outputs["c"][0] == "join"
    assert checked.count("fresh-shape") == 1  # (its ``after`` a list: a user's graph may be)
    loop = {
        "a": GraphNode("left", after=("b",), compose=lambda done: "a"),
        "b": GraphNode("right", after=("a",), compose=lambda done: "b"),
    }
    running.clear()
    for _ in range(2):  # a refused shape is refused each time, not kept
        with pytest.raises(ValueError, match="cycl"):
            running_engine.submit_graph(RequestGraph("loop", dict(loop)))
    assert checked.count("loop") == 2 and running == []


def test_a_request_refused_as_it_starts_gives_its_shares_back(engine: Any) -> None:
    """Its first step answered by the cache, the next step's input is composed at once, as the
    request starts; when that refuses, the request ends there: no share of any stage stays
    held for its principal, nothing of it stays queued."""
    from types import SimpleNamespace

    running_engine, _, running = engine
    caller = SimpleNamespace(name="alice")

    def graph(compose: Any) -> RequestGraph:
        return RequestGraph(
            "after-a-hit",
            {
                "a": GraphNode(
                    "left", payload="x", cache_key=lambda variant, version: ("hit", variant)
                ),
                "c": GraphNode("join", after=("a",), compose=compose),
            },
            principal=caller,
        )

    running_engine.submit_graph(graph(lambda done: "warm")).result(timeout=30)  # fills "a"
    running.clear()
    for _ in range(3):
        with pytest.raises(InvalidInputError, match="over the limit"):
            running_engine.submit_graph(graph(_refuse))
    assert running_engine.admission.shares.held("join", "alice") == 0
    assert running_engine.admission.shares.held("left", "alice") == 0
    assert running_engine._requests == {}
    assert running == []


def _refuse(done: Mapping[str, Any]) -> Any:
    raise InvalidInputError("the prompt is over the limit")


def test_parts_that_wait_run_a_few_at_a_time_and_are_all_answered(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large input's parts: each waits for the part two places before it (not taking its
    output), so no more than two are queued or running at once; every part is answered, a
    part the cache has is not run, and all parts are admitted together, once."""
    running_engine, store, running = engine
    store.values[("left", ("part", 5))] = ("left", "cached 5")
    admitted: list[float] = []
    admit = running_engine.admitter.admit

    def counting(stage: str, *args: Any, **kwargs: Any) -> Any:
        admitted.append(kwargs["items"])
        return admit(stage, *args, **kwargs)

    monkeypatch.setattr(running_engine.admitter, "admit", counting)
    in_flight: list[int] = []
    live = 0
    enqueue, finish = running_engine.scheduler.enqueue, running_engine.outcomes.finish

    def enqueueing(task: Any) -> Any:
        nonlocal live
        live += 1
        in_flight.append(live)
        return enqueue(task)

    def finishing(outcome: Any) -> Any:
        nonlocal live
        live -= 1  # before the parts it unblocks are queued
        return finish(outcome)

    monkeypatch.setattr(running_engine.scheduler, "enqueue", enqueueing)
    monkeypatch.setattr(running_engine.outcomes, "finish", finishing)
    names = [f"part{n}" for n in range(6)]
    nodes = {
        name: GraphNode(
            "left",
            payload=f"p{n}",
            items=2,
            cache_key=lambda variant, version, n=n: ("part", n),
            waits=(names[n - 2],) if n >= 2 else (),
        )
        for n, name in enumerate(names)
    }
    result = running_engine.submit_graph(RequestGraph("parts", nodes)).result(timeout=30)
    assert result.outputs == {
        name: ("left", "cached 5" if n == 5 else f"p{n}") for n, name in enumerate(names)
    }
    assert result.cached == {"part5": "memory"}
    assert running == ["left"] * 5
    assert admitted == [10]  # the parts the cache did not answer, judged as one request
    assert len(in_flight) == 5 and max(in_flight) <= 2
    # the control: without waiting, every part is queued at once
    in_flight.clear()
    free = {name: GraphNode("left", payload=f"q{n}") for n, name in enumerate(names)}
    running_engine.submit_graph(RequestGraph("free", free)).result(timeout=30)
    assert in_flight[:6] == [1, 2, 3, 4, 5, 6]


class Gated(Echo):
    """Echo that records each payload it runs and holds the first one (``p0``) until the
    test lets it go."""

    def __init__(self, stage: str, running: list[str]) -> None:
        super().__init__(stage, running)
        self.started = threading.Event()
        self.release = threading.Event()

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        if "p0" in payloads:
            self.started.set()
            assert self.release.wait(timeout=30)
        self.running.extend(str(payload) for payload in payloads)
        return [(self.stage, payload) for payload in payloads]


def test_requests_that_arrive_during_a_large_one_run_between_its_parts() -> None:
    """A part queued once an earlier part is done ranks as arriving then: a small request
    sent while the first part runs is served before the parts queued after it, not after
    the whole large request (with the request's own arrival time on every part, it ran
    last)."""
    order: list[str] = []
    gated = Gated("left", order)
    plugins = {"left": gated, "right": Echo("right", []), "join": Echo("join", [])}
    one_device = POLICY + 'devices: {allow: ["npu:onnxruntime/CPUExecutionProvider"]}\n'
    policy = load_policy_text(one_device, "graph.yaml")  # one lane: one part at a time
    with Engine(policy, Registry(), plugins=plugins) as running_engine:
        running_engine.warm_up()
        order.clear()
        names = [f"p{n}" for n in range(6)]
        nodes = {
            name: GraphNode("left", payload=name, waits=(names[n - 2],) if n >= 2 else ())
            for n, name in enumerate(names)
        }
        large = running_engine.submit_graph(RequestGraph("large", nodes))
        assert gated.started.wait(timeout=30)  # p0 runs, p1 is queued
        small = running_engine.submit_graph(
            RequestGraph("small", {"s": GraphNode("left", payload="s0")})
        )
        gated.release.set()
        large.result(timeout=30), small.result(timeout=30)
    assert order == ["p0", "p1", "s0", "p2", "p3", "p4", "p5"]


class Gate(StagePlugin):
    """Holds its batch until released (to look at the engine while a request is live)."""

    name = "gate"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        return {}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        self.entered.set()
        assert self.release.wait(timeout=30)
        return list(payloads)


def test_the_scheduler_knows_how_many_requests_are_live() -> None:
    """What placement reads as "other work on the cores" (core_shares.py): admitted requests,
    not yet answered, counted from start to end."""
    gate = Gate()
    plugins = {"left": gate, "right": Echo("right", []), "join": Echo("join", [])}
    with Engine(load_policy_text(POLICY, "live.yaml"), Registry(), plugins=plugins) as live:
        live.warm_up()
        assert live.scheduler.requests_live == 0
        held = live.submit_graph(RequestGraph("one", {"a": GraphNode("left", payload=1)}))
        assert gate.entered.wait(timeout=30)
        assert live.scheduler.requests_live == 1
        gate.release.set()
        assert held.result(timeout=30).outputs["a"] == 1
        assert live.scheduler.requests_live == 0
