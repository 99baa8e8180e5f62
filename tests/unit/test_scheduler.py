"""The scheduler on simulated devices and a virtual clock: deterministic placement, memory,
breakers, rejections and the alternative placement policies."""

from __future__ import annotations

import dataclasses

import pytest

from hetero.framework.devices import DeviceClass, DeviceSpec
from hetero.framework.errors import NoEligibleDeviceError
from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import Policy, load_policy_text
from hetero.framework.scheduler import (
    BreakerState,
    Dispatch,
    MemoryManager,
    OutputHandle,
    Rejection,
    Scheduler,
    StageTask,
    VirtualClock,
)
from hetero.framework.scheduler.request_admission import RequestAdmission
from hetero.framework.topology import Topology

POLICY = """\
version: 1
devices:
  simulated:
    - {name: a, preset: A100-SXM4-80GB, count: 2, host: left}
    - {name: b, preset: A100-SXM4-80GB, count: 2, host: right}
    - {name: cpu, preset: Xeon-8480+, count: 1, host: left}
stages:
  vision:
    modality: image
    device_classes: [cuda]
    variants:
      full: {flops_per_item: 400 GFLOPS, bytes_per_item: 1 GB, resident_bytes: 2 GB,
             input_bytes: 600000, output_bytes: 1 MB, max_batch: 8, dtype: fp16}
      light: {flops_per_item: 100 GFLOPS, bytes_per_item: 0.5 GB, resident_bytes: 2 GB,
              max_batch: 8, dtype: fp16}
  llm:
    modality: text
    device_classes: [cuda]
    variants:
      full: {flops_per_item: 10 TFLOPS, bytes_per_item: 100 GB, resident_bytes: 16 GB,
             input_bytes: 1 MB, max_batch: 16, dtype: fp16}
  big:
    modality: text
    device_classes: [cuda]
    min_residency_s: 0
    variants:
      full: {flops_per_item: 1 TFLOPS, bytes_per_item: 40 GB, resident_bytes: 40 GB,
             dtype: fp16, max_batch: 2}
  cpu_only:
    modality: text
    device_classes: [cpu]
    variants:
      full: {flops_per_item: 1 GFLOPS, bytes_per_item: 1 MB, resident_bytes: 1 MB}
pipelines:
  ask: {steps: [{stage: vision}, {stage: llm}]}
routes: {/ask: ask}
scheduler: {memory_reserve_fraction: 0.0, min_residency_s: 30}
circuit_breaker:
  device: {window: 4, min_calls: 4, error_rate: 0.5, open_s: 10, half_open_probes: 1}
qos:
  default_class: standard
  classes:
    interactive: {weight: 8, sla_tier: t}
    standard: {weight: 4, sla_tier: t}
sla_tiers: {t: {deadline_ms: 1000}}
"""


def make(placement: str | None = None, policy_text: str = POLICY) -> tuple[Scheduler, VirtualClock]:
    policy: Policy = load_policy_text(policy_text, "scheduler.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    clock = VirtualClock()
    return Scheduler(policy, devices, Topology(devices), clock, placement=placement), clock


def task(
    stage: str,
    *,
    qos: str = "standard",
    inputs: tuple[OutputHandle, ...] = (),
    variant: str = "full",
) -> StageTask:
    return StageTask("r", stage, stage, variant, qos, arrival=0.0, deadline=1.0, inputs=inputs)


def place(scheduler: Scheduler, item: StageTask) -> Dispatch:
    scheduler.enqueue(item)
    outcome = scheduler.dispatch()
    assert isinstance(outcome, Dispatch), outcome
    return outcome


def test_decision_keeps_its_cost_terms() -> None:
    scheduler, _ = make()
    dispatch = place(scheduler, task("vision"))
    decision = dispatch.decision
    assert decision.device_id.startswith("sim:a-") or decision.device_id.startswith("sim:b-")
    assert decision.load_s > 0 and decision.compute_s > 0 and decision.queue_s == 0
    assert decision.estimate_s == pytest.approx(
        decision.load_s + decision.compute_s + decision.transfer_s
    )
    assert decision.candidates == 4  # the CPU is not allowed
    assert scheduler.decisions[-1] is decision
    assert dispatch.load.load and scheduler.stats.counts["loads"] == 1


def test_a_resident_model_wins_over_loading_it_elsewhere() -> None:
    scheduler, _ = make()
    first = place(scheduler, task("vision"))
    scheduler.completed(first, ok=True, run_s=0.005)
    second = place(scheduler, task("vision"))
    assert second.device_id == first.device_id
    assert not second.load.load


def test_the_next_stage_stays_on_the_nvlink_island_of_its_input() -> None:
    scheduler, _ = make()
    # Make llm resident on one device per host, so load time does not decide.
    assert scheduler.preload("sim:a-0", "llm/full")
    assert scheduler.preload("sim:b-0", "llm/full")
    handle = OutputHandle("sim:b-1", value=None, size_bytes=200 * 10**6)
    dispatch = place(scheduler, task("llm", inputs=(handle,)))
    assert dispatch.device_id == "sim:b-0"  # NVLink from b-1, not the network to a-0
    assert dispatch.decision.transfer_s < 0.01


def test_priority_class_is_dispatched_first_across_stages() -> None:
    scheduler, _ = make()
    scheduler.enqueue(task("vision", qos="standard"))
    scheduler.enqueue(task("llm", qos="interactive"))
    first = scheduler.dispatch()
    assert isinstance(first, Dispatch) and first.task.stage == "llm"


def test_memory_manager_evicts_one_large_idle_model_before_small_hot_ones() -> None:
    manager = MemoryManager("d", capacity=100)
    for key, size in (("large", 60), ("s1", 10), ("s2", 10), ("s3", 10)):
        manager.apply(manager.plan(key, size, 0.0), size, 1.0, 0.0, 0.0)  # type: ignore[arg-type]
    for key in ("s1", "s2", "s3"):
        manager.begin(key, 50.0)
        manager.end(key, 50.0)  # the small ones are hot
    plan = manager.plan("new", 50, 60.0)
    assert plan is not None and plan.evict == ("large",)
    manager.begin("large", 60.0)  # work in flight: never evicted
    assert manager.plan("new", 50, 61.0) is None
    young = MemoryManager("d", capacity=10)
    young.apply(young.plan("m", 10, 0.0), 10, 1.0, 0.0, 30.0)  # type: ignore[arg-type]
    assert young.plan("other", 5, 10.0) is None  # younger than its minimum residency
    assert young.plan("other", 5, 31.0) is not None


def test_no_room_anywhere_waits_then_goes_when_a_model_finishes() -> None:
    text = POLICY.replace("resident_bytes: 16 GB", "resident_bytes: 45 GB")
    scheduler, clock = make(policy_text=text)
    held = [place(scheduler, task("big")) for _ in range(8)]  # 40 GB in flight on every GPU
    assert {d.device_id for d in held} == {"sim:a-0", "sim:a-1", "sim:b-0", "sim:b-1"}
    scheduler.enqueue(task("llm"))
    assert scheduler.dispatch() is None  # 45 GB fits nowhere beside a busy 40 GB model: wait
    clock.advance(1.0)
    freed = held[0].device_id
    for dispatch in held:
        if dispatch.device_id == freed:
            scheduler.completed(dispatch, ok=True, run_s=0.01)
    outcome = scheduler.dispatch()
    assert isinstance(outcome, Dispatch) and outcome.device_id == freed
    assert outcome.load.evict == ("big/full",)
    assert scheduler.stats.counts["evictions"] == 1


def test_a_stage_with_no_eligible_device_is_rejected_with_reasons() -> None:
    text = POLICY.replace(
        "preset: Xeon-8480+, count: 1", "preset: Xeon-8480+, count: 1, memory: 1 KB"
    )
    scheduler, _ = make(policy_text=text)
    scheduler.enqueue(task("cpu_only"))
    outcome = scheduler.dispatch()
    assert isinstance(outcome, Rejection)
    assert isinstance(outcome.error, NoEligibleDeviceError)
    assert "sim:a-0: class cuda not allowed" in str(outcome.error)
    assert "sim:cpu-0: model larger" in str(outcome.error)


def test_failures_open_the_breaker_then_half_open_probes_close_it() -> None:
    scheduler, clock = make()
    others = ("sim:a-1", "sim:b-0", "sim:b-1")
    for device in others:
        scheduler.set_health(device, False)
    for _ in range(4):  # four failures in a window of four: open
        dispatch = place(scheduler, task("vision"))
        assert dispatch.device_id == "sim:a-0"
        scheduler.completed(dispatch, ok=False, run_s=0.01)
    breaker = scheduler.breaker("vision", "sim:a-0")
    assert breaker.state is BreakerState.OPEN
    assert scheduler.stats.counts["breaker_open"] == 1
    scheduler.enqueue(task("vision"))
    outcome = scheduler.dispatch()
    assert isinstance(outcome, Rejection)  # the only healthy device has its breaker open
    assert "circuit breaker open" in str(outcome.error)
    for device in others:
        scheduler.set_health(device, True)
    assert place(scheduler, task("vision")).device_id != "sim:a-0"
    clock.advance(10.0)
    for device in others:
        scheduler.set_health(device, False)
    probe = place(scheduler, task("vision"))  # half-open: one probe goes through
    assert probe.device_id == "sim:a-0" and breaker.state is BreakerState.HALF_OPEN
    scheduler.enqueue(task("vision"))
    assert isinstance(scheduler.dispatch(), Rejection)  # no second probe while one is out
    scheduler.completed(probe, ok=True, run_s=0.01)
    assert breaker.state is BreakerState.CLOSED
    assert place(scheduler, task("vision")).device_id == "sim:a-0"


def test_retry_excludes_the_failed_device_and_unhealthy_devices_are_skipped() -> None:
    scheduler, _ = make()
    first = place(scheduler, task("vision"))
    scheduler.completed(first, ok=False, run_s=0.0)
    retry = task("vision")
    retry.excluded = frozenset({first.device_id})
    assert place(scheduler, retry).device_id != first.device_id
    scheduler.set_health("sim:a-0", False)
    scheduler.set_health("sim:a-1", False)
    for _ in range(4):
        assert place(scheduler, task("vision")).device_id.startswith("sim:b-")


@pytest.mark.parametrize("placement", ["round_robin", "least_connections"])
def test_alternative_placements_spread_work(placement: str) -> None:
    scheduler, _ = make(placement)
    chosen = [place(scheduler, task("vision")).device_id for _ in range(4)]
    assert sorted(chosen) == ["sim:a-0", "sim:a-1", "sim:b-0", "sim:b-1"]
    assert scheduler.decisions[-1].policy == placement


def test_an_input_whose_device_vanished_costs_a_host_copy() -> None:
    scheduler, _ = make()
    gone = OutputHandle("sim:removed-0", value=None, size_bytes=10**9)
    dispatch = place(scheduler, task("llm", inputs=(gone,)))
    assert dispatch.decision.transfer_s == pytest.approx(10**9 / 32e9)  # A100 host link


def test_unknown_placement_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown placement"):
        make("random")


def test_measured_runs_correct_the_estimate() -> None:
    scheduler, _ = make()
    first = place(scheduler, task("vision"))
    modelled = first.decision.compute_s
    scheduler.completed(first, ok=True, run_s=modelled * 3)
    second = place(scheduler, task("vision"))
    assert second.device_id == first.device_id
    index = scheduler.fleet.index[first.device_id]
    assert scheduler.tables["vision/full"].correction[index] == pytest.approx(1 + 0.2 * 2)


def test_young_models_yield_to_a_starved_stage_but_never_their_last_copy() -> None:
    text = (
        POLICY.replace("resident_bytes: 16 GB", "resident_bytes: 45 GB")
        .replace("    min_residency_s: 0\n", "    min_residency_s: 30\n")
        .replace("min_residency_s: 30}", "min_residency_s: 30, max_load_wait_s: 60}")
    )
    scheduler, clock = make(policy_text=text)
    held = [place(scheduler, task("big")) for _ in range(8)]
    assert {d.device_id for d in held} == {"sim:a-0", "sim:a-1", "sim:b-0", "sim:b-1"}
    for dispatch in held:
        scheduler.completed(dispatch, ok=True, run_s=0.01)  # idle now, but young
    big = scheduler.tables["big/full"].resident
    replicas = []
    while True:  # llm batches of 16: each new replica may evict a young, replicated big
        scheduler.enqueue(task("llm"))
        outcome = scheduler.dispatch()
        if outcome is None:
            break
        assert isinstance(outcome, Dispatch)
        if outcome.load.load:
            assert outcome.load.evict == ("big/full",)
            replicas.append(outcome.device_id)
        for _ in range(15):
            assert place(scheduler, task("llm")).device_id == outcome.device_id
    assert len(replicas) == 3 and int(big.sum()) == 1  # the last copy of big stays
    assert scheduler.next_retry_at == pytest.approx(30.0)
    clock.advance(35.0)
    last = scheduler.dispatch()  # nothing completed, yet it goes once big may leave
    assert isinstance(last, Dispatch) and last.load.evict == ("big/full",)
    assert not big.any()


def test_outstanding_work_per_device_is_capped_so_priority_decides() -> None:
    scheduler, _ = make()
    for _ in range(40):
        scheduler.enqueue(task("vision", qos="standard"))
    dispatched = []
    while isinstance(outcome := scheduler.dispatch(), Dispatch):
        dispatched.append(outcome)
    assert len(dispatched) == 4 * 8  # one batch (max_batch 8) per GPU, the rest wait queued
    scheduler.enqueue(task("vision", qos="interactive"))
    scheduler.completed(dispatched[0], ok=True, run_s=0.01)
    nxt = scheduler.dispatch()
    assert isinstance(nxt, Dispatch) and nxt.task.qos_class == "interactive"


CPU_POLICY = """\
version: 1
stages:
  embed:
    modality: text
    variants:
      full: {flops_per_item: 10 GFLOPS, bytes_per_item: 1 MB, resident_bytes: 1 MB,
             max_batch: 8}
scheduler: {memory_reserve_fraction: 0.0}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 1000}}
"""


def _runtime_device(name: str, host: str, flops: float) -> DeviceSpec:
    return DeviceSpec(
        id=f"npu:{name}/CPU",
        device_class=DeviceClass.CPU,
        vendor_name="host CPU",
        backend="npu",
        host=host,
        memory_bytes=1 << 30,
        peak_flops={"fp32": flops},
        memory_bandwidth_bytes_per_s=1e10,
        properties={"shares_host_memory": True},
    )


def _placements(hosts: tuple[str, str]) -> list[str]:
    policy = load_policy_text(CPU_POLICY, "cpu.yaml")
    devices = [_runtime_device("fast", hosts[0], 2e11), _runtime_device("slow", hosts[1], 1e11)]
    scheduler = Scheduler(policy, devices, Topology(devices), VirtualClock())
    return [place(scheduler, task("embed")).device_id for _ in range(6)]


def test_runtimes_over_one_host_cpu_share_its_backlog() -> None:
    # Two runtimes over the same cores: work queued on one delays the other, so everything
    # goes to the faster one rather than spilling onto the slower "idle" one.
    assert set(_placements(("host", "host"))) == {"npu:fast/CPU"}
    # The control: the same devices on two hosts are independent, and the backlog spreads.
    assert set(_placements(("host-a", "host-b"))) == {"npu:fast/CPU", "npu:slow/CPU"}


def test_a_device_with_run_slots_takes_that_many_tasks_and_its_own_memory_figure() -> None:
    scheduler, _ = make()
    assert RequestAdmission(scheduler.policy, scheduler).run_slots("cpu_only") == 1
    first = place(scheduler, task("cpu_only"))
    scheduler.enqueue(task("cpu_only"))
    assert scheduler.dispatch() is None  # one batch outstanding per device: the rest waits
    scheduler.completed(first, ok=True, run_s=0.001)
    assert isinstance(scheduler.dispatch(), Dispatch)  # the queued one goes now

    fitted, _ = make()
    # An engine with continuous batching there: three at once, and its KV cache resident.
    fitted.set_device_fit("cpu_only", "sim:cpu-0", slots=3, resident_bytes=5 * 10**6)
    hint = fitted.tables["cpu_only/full"].costs.hint
    fitted.set_hint("cpu_only", "full", hint)  # a new hint keeps the device's fit
    running = [place(fitted, task("cpu_only")) for _ in range(3)]
    fitted.enqueue(task("cpu_only"))
    assert fitted.dispatch() is None  # the fourth waits for a slot
    index = fitted.fleet.index["sim:cpu-0"]
    assert RequestAdmission(fitted.policy, fitted).run_slots("cpu_only") == 3
    assert fitted.memory[index].used == 5 * 10**6
    assert fitted.backlog[index] == pytest.approx(sum(d.estimate_s for d in running) / 3)
    fitted.completed(running[0], ok=True, run_s=0.001)
    assert fitted.backlog[index] == pytest.approx(sum(d.estimate_s for d in running[1:]) / 3)
    with pytest.raises(ValueError, match="slots"):
        fitted.set_device_fit("cpu_only", "sim:cpu-0", slots=0)


def test_devices_that_join_are_placed_on_and_the_old_ones_keep_their_state() -> None:
    scheduler, _ = make()
    first = place(scheduler, task("llm"))  # resident and busy on one of the four A100s
    joined = [
        dataclasses.replace(d, id=f"sim:joined-{i}", host="third", links=())
        for i, d in enumerate(scheduler.devices[:2])
    ]
    everything = list(scheduler.devices) + joined
    scheduler.add_devices(joined, Topology(everything))
    index = scheduler.fleet.index[first.device_id]
    assert scheduler.tables["llm/full"].resident[index]
    assert scheduler.in_flight[index] == 1
    placed = {place(scheduler, task("vision")).device_id for _ in range(12)}
    assert placed & {d.id for d in joined}  # the newcomers take work
    assert scheduler.fleet.hosts == 3


def test_the_kept_fastest_time_is_the_least_over_runnable_healthy_devices() -> None:
    """Admission reads ``fastest_s`` on every arrival; it is kept between calls and only
    dropped when a device's change may move it. Through random measured runs, health moves
    and all, it must equal the least unit time worked out from scratch."""
    import random

    import numpy as np

    scheduler, clock = make()
    tables = scheduler.tables["vision/full"]
    rng = random.Random(7)
    kept_over_calls = 0
    for step in range(300):
        clock.advance(0.01)
        dispatch = place(scheduler, task("vision"))
        run_s = dispatch.decision.compute_s * rng.uniform(0.6, 1.4)
        scheduler.completed(dispatch, ok=True, run_s=run_s)
        if step % 50 == 25:
            device = scheduler.devices[rng.randrange(4)].id
            scheduler.set_health(device, step % 100 != 25)
        before = tables.fastest_s
        fastest = scheduler.fastest_s("vision")
        kept_over_calls += before is not None
        runnable = tables.costs.runnable & scheduler.healthy
        assert fastest == float(np.min(tables.unit_s[runnable]))
    assert kept_over_calls > 20  # the kept figure is used, not rebuilt on every call


def test_a_dispatch_with_every_queue_empty_answers_none_and_cancels_are_counted() -> None:
    scheduler, _ = make()
    kept, dropped = task("vision"), task("llm")
    scheduler.enqueue(kept)
    scheduler.enqueue(dropped)
    scheduler.cancel(dropped)
    scheduler.cancel(dropped)  # twice: counted once
    outcome = scheduler.dispatch()
    assert isinstance(outcome, Dispatch) and outcome.task is kept
    assert scheduler.dispatch() is None
    scheduler.enqueue(task("llm"))  # a queue that had only a cancelled task takes new work
    assert isinstance(scheduler.dispatch(), Dispatch)


AHEAD_POLICY = """\
version: 1
devices:
  simulated:
    - {name: slow, preset: A100-SXM4-80GB, count: 1, host: h}
    - {name: fast, preset: MI300X, count: 1, host: h}
stages:
  llm:
    modality: text
    device_classes: [cuda, rocm]
    variants:
      full: {flops_per_item: 10 TFLOPS, bytes_per_item: 100 GB, resident_bytes: 16 GB,
             max_batch: 16, dtype: fp16, dispatch_ahead_ms: AHEAD}
scheduler: {memory_reserve_fraction: 0.0, batching: {dispatch_ahead_ms: 1}}
qos:
  default_class: standard
  classes:
    interactive: {weight: 8, sla_tier: t}
    standard: {weight: 4, sla_tier: t}
sla_tiers: {t: {deadline_ms: 1000}}
"""


def _held(scheduler: Scheduler, tasks: int) -> list[Dispatch]:
    """Enqueue ``tasks`` LLM tasks and dispatch until no device takes more."""
    for _ in range(tasks):
        scheduler.enqueue(task("llm"))
    held: list[Dispatch] = []
    while isinstance(outcome := scheduler.dispatch(), Dispatch):
        held.append(outcome)
    return held


def _per_device(held: list[Dispatch]) -> dict[str, int]:
    devices = sorted({h.device_id for h in held})
    return {d: sum(1 for h in held if h.device_id == d) for d in devices}


def _fits(scheduler: Scheduler, device_id: str, ahead_s: float) -> int:
    """The largest batch the cost model times under ``ahead_s`` on the device (at least 1)."""
    index = scheduler.fleet.index[device_id]
    batch_s = scheduler.tables["llm/full"].costs.batch_s[index]
    return max([1] + [k for k, seconds in enumerate(batch_s) if seconds <= ahead_s])


def test_dispatch_ahead_keeps_work_in_the_shared_queue_by_each_devices_pace() -> None:
    """With ``dispatch_ahead_ms`` a device holds only what it would run within that time, so
    a slow device holds fewer tasks than a fast one and the rest wait in the shared queue,
    where priority still decides; without it each holds a whole batch (the control)."""
    unbounded, _ = make(
        policy_text=AHEAD_POLICY.replace("dispatch_ahead_ms: 1}", "}").replace(
            ", dispatch_ahead_ms: AHEAD", ""
        )
    )
    assert _per_device(_held(unbounded, 40)) == {"sim:fast-0": 16, "sim:slow-0": 16}
    scheduler, _ = make(policy_text=AHEAD_POLICY.replace("AHEAD", "200"))
    slow, fast = _fits(scheduler, "sim:slow-0", 0.2), _fits(scheduler, "sim:fast-0", 0.2)
    assert 1 < slow < fast < 16  # the bound is in time, so it binds by each device's pace
    held = _held(scheduler, 40)
    assert _per_device(held) == {"sim:fast-0": fast, "sim:slow-0": slow}
    scheduler.enqueue(task("llm", qos="interactive"))  # behind 40 - slow - fast standard tasks
    assert scheduler.dispatch() is None  # both devices hold all they may
    scheduler.completed(held[0], ok=True, run_s=held[0].decision.compute_s)
    nxt = scheduler.dispatch()
    assert isinstance(nxt, Dispatch) and nxt.task.qos_class == "interactive"


def test_dispatch_ahead_follows_the_measured_pace_and_holds_one_task_at_least() -> None:
    scheduler, _ = make(policy_text=AHEAD_POLICY.replace("AHEAD", "200"))
    first = place(scheduler, task("llm"))
    index = scheduler.fleet.index[first.device_id]
    tables = scheduler.tables["llm/full"]
    before = int(tables.limit[index])
    scheduler.completed(first, ok=True, run_s=first.decision.compute_s * 3)  # 1.4x slower
    after = int(tables.limit[index])
    assert after == _fits(scheduler, first.device_id, 0.2 / tables.correction[index]) < before
    # The policy-wide bound (1 ms) is shorter than any task: a variant without its own holds one.
    fallback, _ = make(policy_text=AHEAD_POLICY.replace(", dispatch_ahead_ms: AHEAD", ""))
    assert _per_device(_held(fallback, 10)) == {"sim:fast-0": 1, "sim:slow-0": 1}


def test_dispatch_ahead_leaves_continuously_batched_stages_alone() -> None:
    """A KV-cache stage batched continuously takes tasks into its running batch at each step,
    so the bound does not apply to it (one sequence's decode would exceed any useful bound);
    batched statically (the control) it does."""
    kv = AHEAD_POLICY.replace(
        "dtype: fp16, dispatch_ahead_ms: AHEAD}",
        "dtype: fp16,\n             kv_bytes_per_token: 0.5 MB}",
    )
    continuous, _ = make(policy_text=kv)
    assert continuous.tables["llm/full"].ahead_s is None
    static_text = kv.replace(
        "batching: {dispatch_ahead_ms: 1}", "batching: {dispatch_ahead_ms: 1, llm: static}"
    )
    static, _ = make(policy_text=static_text)
    assert static.tables["llm/full"].ahead_s == pytest.approx(0.001)
    assert list(static.tables["llm/full"].limit) == [1, 1]
    assert list(continuous.tables["llm/full"].limit) == [16, 16]
