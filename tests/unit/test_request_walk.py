"""The request walk the engine and the simulator share: a request's stages admitted once each,
its ready steps queued as tasks, the next ones as outputs arrive, and its shares and queued
steps given back when it ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hetero.framework.engine.request_graph import GraphNode
from hetero.framework.engine.request_walk import RequestWalk, principal_name
from hetero.framework.engine.requests import RequestState
from hetero.framework.errors import ShedError
from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.scheduler import OutputHandle, RequestProfile, Scheduler, VirtualClock
from hetero.framework.scheduler.request_admission import RequestAdmission
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.run import _Simulation

POLICY = """\
version: 1
devices:
  simulated:
    - {name: g, preset: H100-SXM5-80GB, count: 1, host: a}
stages:
  look:
    modality: image
    variants:
      full: {flops_per_item: 1 TFLOPS, bytes_per_item: 1 GB, resident_bytes: 1 GB, max_batch: 8}
  say:
    modality: text
    variants:
      full: {flops_per_item: 1 TFLOPS, bytes_per_item: 1 GB, resident_bytes: 1 GB, max_batch: 8}
pipelines:
  both:
    steps:
      - {stage: look, name: left, after: []}
      - {stage: look, name: right, after: []}
      - {stage: say, after: [left, right]}
routes: {/both: both}
qos:
  default_class: standard
  classes:
    standard: {weight: 1, sla_tier: t, queue_bound: QUEUE_BOUND}
sla_tiers: {t: {deadline_ms: 60000}}
"""


class _Pictures:
    """Measures a payload that is a list of pictures: one item each."""

    def items(self, payload: Any) -> int:
        return len(payload)

    def kv_tokens(self, payload: Any, output_tokens: int) -> int:
        return 0


class _Recorded:
    """Admission asked through the walk's hook, each call recorded."""

    def __init__(self, admission: RequestAdmission) -> None:
        self.admission = admission
        self.calls: list[tuple[str, int, Any]] = []

    def __call__(
        self,
        stage: str,
        qos_class: str | None,
        profile: RequestProfile | None,
        *,
        items: int = 1,
        principal: Any = None,
        sequence: Any = None,
    ) -> tuple[str, str]:
        self.calls.append((stage, items, profile))
        return "full", ""


def _walk(queue_bound: int = 16) -> tuple[RequestWalk, Scheduler, _Recorded]:
    policy = load_policy_text(POLICY.replace("QUEUE_BOUND", str(queue_bound)), "walk.yaml")
    fleet = resolve_fleet(policy, Registry(use_entry_points=False))
    scheduler = Scheduler(policy, fleet.devices, fleet.topology(), VirtualClock())
    admission = RequestAdmission(policy, scheduler)
    recorded = _Recorded(admission)
    walk = RequestWalk(admission, scheduler, {"look": _Pictures()}, recorded)
    return walk, scheduler, recorded


def _request(walk: RequestWalk, request_id: str, principal: str | None = None) -> RequestState:
    pipeline = walk.scheduler.policy.pipelines["both"]
    nodes = {
        "left": GraphNode("look", payload=["a", "b"], profile=RequestProfile(image_pixels=10)),
        "right": GraphNode("look", payload=["c"], profile=RequestProfile(image_pixels=90)),
        "say": GraphNode("say", ("left", "right"), payload="words"),
    }
    state = RequestState(
        request_id=request_id,
        route="/both",
        pipeline=pipeline,
        payload=None,
        qos_class="standard",
        variant="full",
        arrival=0.0,
        deadline=60.0,
        principal=principal,
    )
    walk.begin(state, nodes)
    return state


def _inputs(state: RequestState, step: str) -> Any:
    return state.payloads[step]


def test_a_stage_is_admitted_once_for_all_its_steps_with_their_items_and_heaviest_profile() -> None:
    walk, _, recorded = _walk()
    _request(walk, "r1")
    assert recorded.calls == [
        ("look", 3, RequestProfile(image_pixels=90)),  # two pictures and one, the larger
        ("say", 1, None),
    ]


def test_ready_steps_are_queued_and_the_next_once_both_outputs_are_in() -> None:
    walk, scheduler, _ = _walk()
    state = _request(walk, "r1")
    walk.enqueue_ready(state, _inputs)
    tasks = {task.step: task for task in state.live_tasks.values()}
    assert set(tasks) == {"left", "right"}  # say waits for both
    assert (tasks["left"].items, tasks["right"].items) == (2, 1)
    assert scheduler.queued("look") == 2
    assert not walk.record(state, tasks["left"], OutputHandle("g", None, 8))
    walk.enqueue_ready(state, _inputs)
    assert {task.step for task in state.live_tasks.values()} == {"right"}  # say not yet
    assert not walk.record(state, tasks["right"], OutputHandle("g", None, 8))
    walk.enqueue_ready(state, _inputs)
    (say,) = state.live_tasks.values()
    assert say.step == "say" and len(say.inputs) == 2
    assert walk.record(state, say, OutputHandle("g", None, 8))  # the request is done


def test_an_ended_request_gives_back_its_shares_and_drops_its_queued_steps() -> None:
    walk, scheduler, _ = _walk()
    shares = walk.admission.shares
    ended = _request(walk, "r1", "alice")
    walk.hold(ended)
    kept = _request(walk, "r2", "bob")  # the control: another principal's request lives on
    walk.hold(kept)
    walk.enqueue_ready(ended, _inputs)
    walk.enqueue_ready(kept, _inputs)
    assert scheduler.queued("look") == 4
    walk.end(ended)
    walk.end(ended)  # twice (failed, then cancelled): nothing given back twice
    assert scheduler.queued("look") == 2
    assert not ended.live_tasks and len(kept.live_tasks) == 2
    assert shares.held("look", "alice") == 0 and shares.held("say", "alice") == 0
    assert shares.held("look", "bob") == 1 and shares.held("say", "bob") == 1


def test_a_step_the_queue_refuses_sheds_and_the_ones_queued_before_it_are_dropped() -> None:
    walk, scheduler, _ = _walk(queue_bound=1)
    state = _request(walk, "r1")
    with pytest.raises(ShedError):
        walk.enqueue_ready(state, _inputs)  # left fits in the bound of one, right does not
    assert len(state.live_tasks) == 1
    walk.end(state)
    assert scheduler.queued("look") == 0


def test_a_string_principal_is_its_own_name() -> None:
    class Caller:
        name = "carol"

    assert principal_name("dave") == "dave"
    assert principal_name(Caller()) == "carol"
    assert principal_name(None) is None


def test_the_simulator_admits_and_queues_through_the_request_walk(tmp_path: Path) -> None:
    policy = load_policy_text(POLICY.replace("QUEUE_BOUND", "16"), "walk.yaml")
    fleet = resolve_fleet(policy, Registry(use_entry_points=False))
    workload_text = """\
name: walk
seed: 1
duration_s: 2
arrivals: {kind: poisson, rate_per_s: 5}
mix:
  - {route: /both, text_tokens: 10, images: 2, image_pixels: 1000}
"""
    path = tmp_path / "walk.yaml"
    path.write_text(workload_text)
    workload = load_workload(path)
    simulation = _Simulation(
        policy, fleet.devices, fleet.topology(), workload, "cost_model", "cost_aware"
    )
    walked: list[str] = []
    begin = simulation.walk.begin

    def counted(state: RequestState, *args: Any, **kwargs: Any) -> None:
        walked.append(state.request_id)
        begin(state, *args, **kwargs)

    simulation.walk.begin = counted  # type: ignore[method-assign]
    enqueue, items = simulation.scheduler.enqueue, {}

    def recorded(task: Any) -> None:
        items[task.stage] = task.items
        enqueue(task)

    simulation.scheduler.enqueue = recorded  # type: ignore[method-assign]
    metrics = simulation.run()
    assert metrics.completed == len(walked) > 0  # every request walked, and finished
    assert items == {"look": 2, "say": 1}  # its two images, as the engine's plugin counts
