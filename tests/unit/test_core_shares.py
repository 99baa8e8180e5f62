"""Runtimes of one CPU weighed by the share of its cores they keep busy, while other work runs
on those cores (``framework/scheduler/core_shares.py``). Alone, the runtime that finishes an
item sooner takes it; while a task of another stage is in flight on the same cores, the one
that takes the least core time does. Each test has its control: no shares, or shares that
agree with the times alone, and nothing moves."""

from __future__ import annotations

import pytest

from hetero.framework.devices import DeviceClass, DeviceSpec
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import Dispatch, Scheduler, StageTask, VirtualClock
from hetero.framework.scheduler.exploring import EXPLORE_EVERY
from hetero.framework.topology import Topology

POLICY = """\
version: 1
stages:
  embed:
    modality: text
    variants:
      full: {flops_per_item: 10 GFLOPS, bytes_per_item: 1 MB, resident_bytes: 1 MB,
             max_batch: 4}
  vision:
    modality: image
    variants:
      full: {flops_per_item: 10 GFLOPS, bytes_per_item: 1 MB, resident_bytes: 1 MB,
             max_batch: 4}
scheduler: {memory_reserve_fraction: 0.0}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 1000}}
"""
# FAST finishes an item 1.2x sooner alone than LEAN does
FAST, LEAN = "npu:fast/CPU", "npu:lean/CPU"


def _device(local: str, flops: float, host: str = "box", memory: int = 1 << 30) -> DeviceSpec:
    return DeviceSpec(
        id=f"npu:{local}",
        device_class=DeviceClass.CPU,
        vendor_name="host CPU",
        backend="npu",
        host=host,
        memory_bytes=memory,
        peak_flops={"fp32": flops},
        memory_bandwidth_bytes_per_s=1e10,
        properties={"shares_host_memory": True},
    )


def _scheduler(
    shares: dict[str, float] | None,
    *,
    preload: tuple[str, ...] = (FAST, LEAN),
    memory: int = 1 << 30,
) -> Scheduler:
    devices = [_device("fast/CPU", 1.2e11, memory=memory), _device("lean/CPU", 1e11, memory=memory)]
    scheduler = Scheduler(
        load_policy_text(POLICY, "cpu.yaml"), devices, Topology(devices), VirtualClock()
    )
    for stage in ("embed", "vision"):
        for device in preload:
            assert scheduler.preload(device, f"{stage}/full")
        for device, share in (shares or {}).items():
            scheduler.probe_core_share(stage, device, share)
    return scheduler


def _place(scheduler: Scheduler, stage: str) -> Dispatch:
    scheduler.enqueue(StageTask("r", stage, stage, "full", "standard", 0.0, 1.0))
    outcome = scheduler.dispatch()
    assert isinstance(outcome, Dispatch)
    return outcome


@pytest.mark.parametrize(
    ("shares", "busy_choice"),
    [
        ({FAST: 1.0, LEAN: 0.7}, LEAN),  # FAST takes 1.2 / 0.7 = 1.7x LEAN's core time
        ({FAST: 0.7, LEAN: 1.0}, FAST),  # control: the faster is also the leaner
        ({FAST: 1.0, LEAN: 0.9}, FAST),  # control: 1.2 x 0.9 > 1.0, still FAST
        (None, FAST),  # control: nothing measured (a simulated fleet)
    ],
)
def test_while_other_work_runs_on_the_cores_the_leaner_runtime_takes_the_task(
    shares: dict[str, float] | None, busy_choice: str
) -> None:
    scheduler = _scheduler(shares)
    # the cores idle: the faster one alone, whatever the shares
    first = _place(scheduler, "embed")
    assert first.device_id == FAST
    scheduler.completed(first, ok=True, run_s=0.1, batch_size=1)
    # a vision task in flight on the same cores: the embedding goes where it takes least
    running = _place(scheduler, "vision")
    assert _place(scheduler, "embed").device_id == busy_choice
    scheduler.completed(running, ok=True, run_s=0.1, batch_size=1)


def test_weights_compare_runtimes_of_one_compute_resource_only() -> None:
    devices = [_device("fast/CPU", 1.2e11), _device("lean/CPU", 1e11)]
    devices.append(_device("other/CPU", 1e11, host="elsewhere"))
    scheduler = Scheduler(
        load_policy_text(POLICY, "cpu.yaml"), devices, Topology(devices), VirtualClock()
    )
    scheduler.probe_core_share("embed", FAST, 1.0)
    scheduler.probe_core_share("embed", LEAN, 0.5)
    scheduler.probe_core_share("embed", "npu:other/CPU", 0.25)  # alone on its host
    estimate = scheduler.estimate_s
    busy = scheduler.busy_estimate_s
    assert busy("embed", "full", FAST) == pytest.approx(2.0 * estimate("embed", "full", FAST))
    assert busy("embed", "full", LEAN) == pytest.approx(estimate("embed", "full", LEAN))
    other = "npu:other/CPU"
    assert busy("embed", "full", other) == pytest.approx(estimate("embed", "full", other))
    assert scheduler.core_share_of("embed", LEAN) == 0.5
    assert scheduler.core_share_of("vision", LEAN) is None  # per stage


def test_a_share_outside_zero_to_one_is_not_taken() -> None:
    scheduler = _scheduler({FAST: 1.5, LEAN: 0.0})
    assert scheduler.core_share_of("embed", FAST) is None
    assert scheduler.core_share_of("embed", LEAN) is None
    assert not scheduler._core_weights


@pytest.mark.parametrize("busy", [True, False])
def test_runner_up_trials_run_only_while_the_cores_run_nothing_else(busy: bool) -> None:
    """A runner-up within the probes' spread is tried in service (exploring.py), by its wall
    time: with core shares measured, only while the cores are idle (the control: idle, it is
    tried within a few periods)."""
    scheduler = _scheduler({FAST: 0.7, LEAN: 1.0})  # FAST: faster alone and leaner
    for device in (FAST, LEAN):
        scheduler.probe_spread("embed", device, 1.3)  # the probes did not tell them apart
    running = _place(scheduler, "vision") if busy else None
    ran = []
    for _ in range(4 * EXPLORE_EVERY):
        dispatch = _place(scheduler, "embed")
        ran.append(dispatch.device_id)
        scheduler.completed(dispatch, ok=True, run_s=0.1, batch_size=1)
    assert (LEAN in ran) == (not busy)
    if running is not None:
        scheduler.completed(running, ok=True, run_s=0.1, batch_size=1)


@pytest.mark.parametrize("fits", [True, False])
def test_the_first_task_while_busy_loads_the_leaner_runtime_if_it_fits(fits: bool) -> None:
    """Warm-up loads only the runtime fastest alone; the leaner one is loaded by the first task
    placed while the cores are busy, its load not counted against it, when it fits in free
    memory without evicting anything (the control: it does not fit, and the task stays)."""
    # the host memory its runtimes share: room for a third model of 1 MB, or (the control) not
    memory = (3 << 20) + (1 << 19) if fits else (2 << 20) + (1 << 19)
    scheduler = _scheduler({FAST: 1.0, LEAN: 0.7}, preload=(FAST,), memory=memory)
    running = _place(scheduler, "vision")  # the cores are busy
    placed = _place(scheduler, "embed")
    assert placed.device_id == (LEAN if fits else FAST)
    scheduler.completed(placed, ok=True, run_s=0.1, batch_size=1)
    scheduler.completed(running, ok=True, run_s=0.1, batch_size=1)


@pytest.mark.parametrize(("live", "choice"), [(2, LEAN), (1, FAST)])
def test_another_live_request_makes_the_cores_busy_between_its_tasks(
    live: int, choice: str
) -> None:
    """No task in flight, but another request live in the engine (its answer being written,
    its next stage not yet queued): its host work shares the cores, so the leaner runtime
    takes the task. The control: only the request being placed is live."""
    scheduler = _scheduler({FAST: 1.0, LEAN: 0.7})
    scheduler.requests_live = live
    assert _place(scheduler, "embed").device_id == choice


def test_cores_are_contended_by_other_tasks_on_them_not_by_a_live_request() -> None:
    scheduler = _scheduler(None)
    assert not scheduler.cores_contended(FAST, 1)  # the control: nothing else anywhere
    _place(scheduler, "embed")  # one task in flight on the host's cores
    assert not scheduler.cores_contended(FAST, 1)  # ... which is the batch asking
    assert scheduler.cores_contended(LEAN, 0)  # another runtime of the same cores asks
    scheduler.requests_live = 2
    assert not scheduler.cores_contended(FAST, 1)  # a live request runs nothing on the cores
    _place(scheduler, "embed")
    assert scheduler.cores_contended(FAST, 1)  # a second task in flight does


def test_tasks_on_another_host_do_not_contend() -> None:
    devices = [_device("fast/CPU", 1.2e11), _device("lean/CPU", 1e11, host="other")]
    scheduler = Scheduler(
        load_policy_text(POLICY, "cpu.yaml"), devices, Topology(devices), VirtualClock()
    )
    for device in (FAST, LEAN):
        assert scheduler.preload(device, "embed/full")
    placed = _place(scheduler, "embed")
    elsewhere = LEAN if placed.device_id == FAST else FAST
    assert scheduler.cores_contended(placed.device_id, 0)  # the control: its own cores are
    assert not scheduler.cores_contended(elsewhere, 0)


@pytest.mark.parametrize(("spread", "choice"), [(1.3, FAST), (1.1, LEAN)])
def test_while_busy_the_shares_move_a_stage_only_by_more_than_the_probes_spread(
    spread: float, choice: str
) -> None:
    """A vision task in flight on the cores; weighed by the shares, LEAN's estimate for an
    embedding is 1.19x below FAST's, the runtime fastest alone. Within the probes' spread
    (1.3x) the probes did not tell them apart, and the embedding stays on FAST; the control,
    a spread of 1.1x, takes the shares' choice."""
    scheduler = _scheduler({FAST: 1.0, LEAN: 0.7})
    for device in (FAST, LEAN):
        scheduler.probe_spread("embed", device, spread)
    running = _place(scheduler, "vision")
    placed = _place(scheduler, "embed")
    assert placed.device_id == choice
    scheduler.completed(placed, ok=True, run_s=0.1, batch_size=1)
    scheduler.completed(running, ok=True, run_s=0.1, batch_size=1)
