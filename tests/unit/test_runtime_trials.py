"""Runtimes of one CPU compared under load (``framework/scheduler/exploring.py``): when the
preferred runtime's measured runs drift from its warm-up figure by more than the gap to the
runner-up, or the runner-up is within the spread of warm-up's own probe runs, one batch in
``EXPLORE_EVERY`` goes to the runner-up, and what it measures there decides which runtime takes
the model. Each test has its control: no drift (or a spread that tells the two apart), no
trial."""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np
import pytest

from hetero.framework.devices import DeviceClass, DeviceSpec
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import Dispatch, Scheduler, StageTask, VirtualClock
from hetero.framework.scheduler.exploring import EXPLORE_EVERY, TRIAL_TASKS
from hetero.framework.topology import Topology

POLICY = """\
version: 1
stages:
  embed:
    modality: text
    variants:
      full: {flops_per_item: 10 GFLOPS, bytes_per_item: 1 MB, resident_bytes: 1 MB,
             max_batch: 2}
scheduler: {memory_reserve_fraction: 0.0}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 1000}}
"""
FIRST, RUNNER_UP = "npu:first/CPU", "npu:second/CPU"


def _device(local: str, flops: float) -> DeviceSpec:
    return DeviceSpec(
        id=f"npu:{local}",
        device_class=DeviceClass.CPU,
        vendor_name="host CPU",
        backend="npu",
        host="box",
        memory_bytes=1 << 30,
        peak_flops={"fp32": flops},
        memory_bandwidth_bytes_per_s=1e10,
        properties={"shares_host_memory": True},
    )


def _scheduler(runner_up_load_s: float | None = None) -> Scheduler:
    """Two runtimes of one CPU, the runner-up 1.2x slower by warm-up's probes; its load
    timed at ``runner_up_load_s`` (None: the cost model's guess, a few of its batches)."""
    devices = [_device("first/CPU", 1.2e11), _device("second/CPU", 1e11)]
    scheduler = Scheduler(
        load_policy_text(POLICY, "cpu.yaml"), devices, Topology(devices), VirtualClock()
    )
    for device in (FIRST, RUNNER_UP):  # warm-up: each as the cost model says
        scheduler.calibrate("embed", device, _modelled(scheduler, device, 1), 1)
    if runner_up_load_s is not None:
        scheduler.load_measured("embed/full", RUNNER_UP, runner_up_load_s)
    return scheduler


def _modelled(scheduler: Scheduler, device_id: str, size: int) -> float:
    costs = scheduler.tables["embed/full"].costs
    return float(costs.batch_s[scheduler.fleet.index[device_id]][size])


def _run_batches(
    scheduler: Scheduler, count: int, pace: dict[str, float], first_run: float = 1.0
) -> list[str]:
    """``count`` rounds of two tasks, each batch taking ``pace[device]`` times the cost
    model's figure there (a device's first batch ``first_run`` times more: its lazy set-up);
    the devices the tasks went to, in order."""
    ran: list[str] = []
    for _ in range(count):
        for _ in range(2):
            scheduler.enqueue(StageTask("r", "embed", "embed", "full", "standard", 0.0, 1.0))
        placed: list[Dispatch] = []
        while isinstance(outcome := scheduler.dispatch(), Dispatch):
            placed.append(outcome)
        for dispatch in placed:
            device = dispatch.device_id
            size = sum(1 for d in placed if d.device_id == device)
            factor = pace[device] * (first_run if device not in ran else 1.0)
            run_s = factor * _modelled(scheduler, device, size)
            scheduler.completed(dispatch, ok=True, run_s=run_s, batch_size=size)
        ran.extend(d.device_id for d in placed)
    return ran


def test_a_runner_up_is_tried_when_service_drifts_and_takes_over_when_faster() -> None:
    scheduler = _scheduler()
    # Under load the preferred runtime runs 1.5x its warm-up figure; the runner-up, tried,
    # 0.8x its own (10x on its first task: loading and lazy set-up, not its pace).
    ran = _run_batches(scheduler, 3 * EXPLORE_EVERY, {FIRST: 1.5, RUNNER_UP: 0.8}, 10.0)
    assert ran[: 2 * EXPLORE_EVERY] == [FIRST] * (2 * EXPLORE_EVERY)
    assert RUNNER_UP in ran
    assert ran[-2:] == [RUNNER_UP] * 2  # it measured faster: it takes the model
    assert scheduler.stats.counts["runtime_trials"] >= 1
    tables = scheduler.tables["embed/full"]
    runner_up = scheduler.fleet.index[RUNNER_UP]
    assert float(tables.correction[runner_up]) < 1.5  # the first task's 10x was not counted


def test_the_control_without_drift_nothing_is_tried() -> None:
    scheduler = _scheduler()
    ran = _run_batches(scheduler, 4 * EXPLORE_EVERY, {FIRST: 1.0, RUNNER_UP: 0.8})
    assert set(ran) == {FIRST}
    assert scheduler.stats.counts["runtime_trials"] == 0


def test_runtimes_the_probes_did_not_tell_apart_are_compared_in_service() -> None:
    """No drift, but warm-up's runs on the preferred runtime were 1.3x apart: the runner-up,
    1.2x slower by the probes, is within that, so it is tried, and it takes the model when it
    measures faster (0.6x its figure, 0.72x the preferred's). The control: runs 1.1x apart
    tell the two apart, and nothing is tried."""
    told_apart = _scheduler()
    told_apart.probe_spread("embed", FIRST, 1.1)
    ran = _run_batches(told_apart, 4 * EXPLORE_EVERY, {FIRST: 1.0, RUNNER_UP: 0.6})
    assert set(ran) == {FIRST}
    assert told_apart.stats.counts["runtime_trials"] == 0

    for spread_on in (FIRST, RUNNER_UP):  # the spread of either of the two
        untold = _scheduler()
        untold.probe_spread("embed", spread_on, 1.3)
        ran = _run_batches(untold, 4 * EXPLORE_EVERY, {FIRST: 1.0, RUNNER_UP: 0.6})
        assert untold.stats.counts["runtime_trials"] >= 1
        assert ran[-2:] == [RUNNER_UP] * 2


def test_a_runner_up_that_measures_slower_stays_the_runner_up() -> None:
    scheduler = _scheduler()
    ran = _run_batches(scheduler, 4 * EXPLORE_EVERY, {FIRST: 1.5, RUNNER_UP: 2.0})
    tried = [i for i, device in enumerate(ran) if device == RUNNER_UP]
    assert tried  # the drift allowed a trial
    assert ran[-2:] == [FIRST] * 2
    # at most a warming task and one batch per EXPLORE_EVERY batches went to it
    assert len(tried) <= 3 * (len(ran) // (2 * EXPLORE_EVERY) + 1)


def test_a_trial_measures_the_runner_up_alone() -> None:
    """What a trial measures is the runner-up's own evidence: the preferred runtime's
    correction does not move with it (a preferred runtime's own runs move the group's)."""
    scheduler = _scheduler()
    tables = scheduler.tables["embed/full"]
    first = scheduler.fleet.index[FIRST]
    rounds = 0
    while RUNNER_UP not in _run_batches(scheduler, 1, {FIRST: 1.5, RUNNER_UP: 0.5}):
        rounds += 1  # a period, and the runner-up's load paid from the budget
        assert rounds <= 3 * EXPLORE_EVERY
    before = float(tables.correction[first])  # it warmed up: the measured batch follows
    rounds = 0
    while not scheduler.stats.counts["runtime_trials"]:  # the trial: warming, then a batch
        _run_batches(scheduler, 1, {FIRST: 1.5, RUNNER_UP: 0.5})
        rounds += 1
        assert rounds <= 3
    assert abs(float(tables.correction[first]) - before) < 0.05 * before


def _backlogged(scheduler: Scheduler, steps: int, pace: dict[str, float]) -> list[str]:
    """A constant backlog of four tasks; one batch in flight finishes at a time (its lazy
    first run 10x)."""
    in_flight: deque[Dispatch] = deque()
    ran: list[str] = []
    for step in range(steps):
        while scheduler.queued("embed") < 4:
            scheduler.enqueue(StageTask(f"t{step}", "embed", "embed", "full", "standard", 0.0, 1.0))
        while isinstance(outcome := scheduler.dispatch(), Dispatch):
            in_flight.append(outcome)
            ran.append(outcome.device_id)
        done = in_flight.popleft()
        factor = pace[done.device_id] * (10.0 if ran.count(done.device_id) == 1 else 1.0)
        run_s = factor * _modelled(scheduler, done.device_id, 2)
        scheduler.completed(done, ok=True, run_s=run_s, batch_size=2)
    return ran


def test_under_a_constant_backlog_a_trial_finishes_and_the_faster_runner_up_takes_over() -> None:
    scheduler = _scheduler()
    ran = _backlogged(scheduler, 20 * EXPLORE_EVERY, {FIRST: 1.5, RUNNER_UP: 0.5})
    assert scheduler.stats.counts["runtime_trials"] >= 1
    assert ran[-10:] == [RUNNER_UP] * 10


def test_a_runner_up_that_stays_slower_is_tried_less_and_less() -> None:
    scheduler = _scheduler()
    batches = 40 * EXPLORE_EVERY
    # the runner-up measures a little slower each time: still within the drift's band
    _run_batches(scheduler, batches, {FIRST: 1.5, RUNNER_UP: 1.6})
    trials = scheduler.stats.counts["runtime_trials"]
    # periods 32, 64, 128, 256, 512: five, not one per 33 batches (38 here)
    assert 3 <= trials <= 6


def test_a_cancelled_trial_task_does_not_end_trials_for_good() -> None:
    scheduler = _scheduler()
    tables = scheduler.tables["embed/full"]
    for number in range(6 * EXPLORE_EVERY):  # one task at a time until the trial's first
        scheduler.enqueue(StageTask(f"c{number}", "embed", "embed", "full", "standard", 0, 1))
        warming = scheduler.dispatch()
        assert isinstance(warming, Dispatch)
        if warming.device_id == RUNNER_UP:
            break
        run_s = 1.5 * _modelled(scheduler, FIRST, 1)
        scheduler.completed(warming, ok=True, run_s=run_s, batch_size=1)
    assert warming.device_id == RUNNER_UP
    scheduler.completed(warming, ok=True, run_s=0.0, judge=False)  # its request was cancelled
    assert tables.pending[scheduler.fleet.index[RUNNER_UP]] == 0
    _run_batches(scheduler, 4 * EXPLORE_EVERY, {FIRST: 1.5, RUNNER_UP: 0.5})
    assert scheduler.stats.counts["runtime_trials"] >= 1


def test_a_trial_never_sends_the_model_to_another_resource() -> None:
    """Two runtimes of one CPU and a slower device on another host: while the runner-up is
    being tried, a task its resource would not win goes where it would have gone anyway (the
    preferred runtime), never to the other host for want of the preferred one."""
    devices = [
        _device("first/CPU", 1.2e11),
        _device("second/CPU", 1e11),
        dataclasses.replace(_device("other/CPU", 0.9e11), host="box2"),
    ]
    scheduler = Scheduler(
        load_policy_text(POLICY, "cpu.yaml"), devices, Topology(devices), VirtualClock()
    )
    for device in devices:
        scheduler.calibrate("embed", device.id, _modelled(scheduler, device.id, 1), 1)
    tried = False
    ran: list[str] = []
    for number in range(12 * EXPLORE_EVERY):  # one task at a time, every runtime at 1.5x
        scheduler.enqueue(StageTask(f"t{number}", "embed", "embed", "full", "standard", 0.0, 1.0))
        placed = scheduler.dispatch()
        assert isinstance(placed, Dispatch)
        ran.append(placed.device_id)
        tried = tried or bool(scheduler._trials.get("embed/full"))
        run_s = 1.5 * _modelled(scheduler, placed.device_id, 1)
        scheduler.completed(placed, ok=True, run_s=run_s, batch_size=1)
    assert tried  # the drift started trials of the (cold) runner-up
    assert "npu:other/CPU" not in ran


def _first_trial_round(runner_up_load_s: float | None) -> int:
    """The round (two tasks, one batch) whose tasks first went to the runner-up."""
    scheduler = _scheduler(runner_up_load_s)
    for number in range(1, 12 * EXPLORE_EVERY):
        if RUNNER_UP in _run_batches(scheduler, 1, {FIRST: 1.5, RUNNER_UP: 0.5}):
            return number
    raise AssertionError("no trial")


def test_a_runner_up_that_must_load_first_waits_until_the_budget_paid_for_its_load() -> None:
    """Its load runs on the cores the runtimes share: a load worth four of the preferred
    runtime's batches waits EXPLORE_EVERY times that many more batches (the control: one
    that loads quickly is tried after about one period)."""
    batch_s = 1.5 * _modelled(_scheduler(), FIRST, 2)  # a batch of two as it runs there
    quick = _first_trial_round(None)  # the cost model's guess: well under a batch's time
    slow = _first_trial_round(4 * batch_s)
    assert quick <= 2 * EXPLORE_EVERY
    assert 3 * EXPLORE_EVERY <= slow - quick <= 5 * EXPLORE_EVERY


def test_a_load_timed_where_it_ran_replaces_the_cost_models_guess() -> None:
    scheduler = _scheduler()
    tables = scheduler.tables["embed/full"]
    first = scheduler.fleet.index[FIRST]
    guess = float(tables.costs.load_s[first])
    scheduler.load_measured("embed/full", FIRST, 2.5)
    assert float(tables.costs.load_s[first]) == 2.5 != guess
    hint = tables.costs.hint  # a new hint rebuilds the tables: the timed load stays
    scheduler.set_hint("embed", "full", hint)
    assert float(scheduler.tables["embed/full"].costs.load_s[first]) == 2.5


def test_a_trial_takes_several_tasks_and_one_outlier_does_not_decide_it() -> None:
    """At concurrency 1 a batch is one task: a trial still measures TRIAL_TASKS of them. The
    runner-up is faster (0.6x) but its first measured task ran 10x (a hiccup): with the mean
    of the four (2.95x) it would stay the runner-up, and a test of the differences' sizes
    would count the hiccup as ten tasks; by their signs and ranks it is one slow task, and the
    next trials' tasks make the runner-up take the model."""
    scheduler = _scheduler()
    scheduler.probe_spread("embed", FIRST, 1.3)  # the probes did not tell the two apart
    ran: list[str] = []
    measured = 0
    for _ in range(8 * EXPLORE_EVERY):
        scheduler.enqueue(StageTask("r", "embed", "embed", "full", "standard", 0.0, 1.0))
        dispatch = scheduler.dispatch()
        assert isinstance(dispatch, Dispatch)
        device = dispatch.device_id
        factor = 1.0
        if device == RUNNER_UP:
            first = RUNNER_UP not in ran  # its load and lazy set-up: the unmeasured task
            factor = 10.0 if first or measured == 0 else 0.6
            measured += 0 if first else 1
            if not first and measured == 1:
                factor = 10.0  # the hiccup, on its first measured task
        scheduler.completed(
            dispatch, ok=True, run_s=factor * _modelled(scheduler, device, 1), batch_size=1
        )
        ran.append(device)
    first_trial = ran[ran.index(RUNNER_UP) :]
    assert first_trial[: 1 + TRIAL_TASKS] == [RUNNER_UP] * (1 + TRIAL_TASKS)  # warming + 4
    assert ran[-2:] == [RUNNER_UP] * 2


def test_after_a_busy_spell_a_trial_is_judged_against_the_preferred_runtime_alone() -> None:
    """While another request was live the preferred runtime ran 2x its warm-up figure (its
    correction, shared with the runner-up's, learnt that level); alone again it runs at its
    figure. The runner-up, 1.2x slower by the probes and 1.06x slower alone in truth, is
    within the probes' spread, so it is tried while the cores are idle. Judged right after
    the load, against the preferred runtime's correction still near the load's level, it
    looked faster and took most of the model's tasks; a trial now waits for a period of
    batches run alone, and it gets only its trials. The control: a runner-up faster alone
    still takes over."""
    rounds = 4 * EXPLORE_EVERY
    for pace in (0.88, 0.6):
        scheduler = _scheduler()
        scheduler.probe_spread("embed", FIRST, 1.3)
        for device in (FIRST, RUNNER_UP):  # alike: the busy weights rank them as idle
            scheduler.probe_core_share("embed", device, 1.0)
        scheduler.requests_live = 2
        busy = _run_batches(scheduler, 2 * EXPLORE_EVERY, {FIRST: 2.0, RUNNER_UP: 2.0 * pace})
        assert set(busy) == {FIRST}  # nothing is tried while the cores run other work
        scheduler.requests_live = 1
        alone = _run_batches(scheduler, rounds, {FIRST: 1.0, RUNNER_UP: pace})
        assert alone[:EXPLORE_EVERY] == [FIRST] * EXPLORE_EVERY  # a period alone first
        tried = alone.count(RUNNER_UP)
        if pace > 1 / 1.2:  # slower alone: a warming task and a trial per period, no more
            assert 0 < tried <= 1 + TRIAL_TASKS * (rounds // EXPLORE_EVERY)
            assert alone[-2:] == [FIRST] * 2
        else:
            assert tried > len(alone) // 2
            assert alone[-2:] == [RUNNER_UP] * 2


def _one_at_a_time(
    scheduler: Scheduler, tasks: int, pace: dict[str, float], seed: int, drift: float = 0.0
) -> list[str]:
    """``tasks`` tasks one after another (concurrency 1), each running ``pace[device]`` times
    the cost model's figure there times a noise factor (log-normal, 15 %, from ``seed``: one
    request's size and the machine's noise) and, with ``drift``, the machine's speed, which
    swings by that much either way every 400 tasks; the devices they went to, in order."""
    swing = 1.0 + drift * np.sin(2 * np.pi * np.arange(tasks) / 400)
    noise = np.random.default_rng(seed).lognormal(0.0, 0.15, tasks) * swing
    ran: list[str] = []
    for number in range(tasks):
        scheduler.enqueue(StageTask(f"n{number}", "embed", "embed", "full", "standard", 0.0, 1.0))
        dispatch = scheduler.dispatch()
        assert isinstance(dispatch, Dispatch)
        device = dispatch.device_id
        factor = pace[device] * float(noise[number]) * (10.0 if device not in ran else 1.0)
        run_s = factor * _modelled(scheduler, device, 1)
        scheduler.completed(dispatch, ok=True, run_s=run_s, batch_size=1)
        ran.append(device)
    return ran


@pytest.mark.parametrize("drift", [0.0, 0.25])
def test_runtimes_that_run_alike_under_noise_do_not_trade_the_model_back_and_forth(
    drift: float,
) -> None:
    """Two runtimes the probes did not tell apart run a model equally fast in truth, each
    task's time varying by 15 %: trials go on, but a trial's few tasks do not move the model;
    only evidence that tells the runtimes apart does (at most one takeover in a run, where
    each trial moved the runner-up's figure half-way to its four tasks' median before and
    the model changed runtimes up to 10 times in 1,920 tasks). The same while the machine's
    speed swings by 25 % either way, since a trial is compared with the preferred runtime's
    tasks just before it (compared with its last 64 tasks, and the runner-up's trials with
    each other over minutes, a runner-up a tenth faster took the model three times in one
    seed, giving it back between). The control: a runner-up a tenth faster under the same
    noise takes the model once, and keeps it."""
    tasks = 60 * EXPLORE_EVERY
    for seed in range(5):
        for faster in (1.0, 0.9):
            scheduler = _scheduler()
            scheduler.probe_spread("embed", FIRST, 1.3)
            # the runner-up's cost model is 1.2x the preferred's: 1/1.2 of it is as fast
            pace = {FIRST: 1.0, RUNNER_UP: faster / 1.2}
            ran = _one_at_a_time(scheduler, tasks, pace, seed, drift)
            counts = scheduler.stats.counts
            assert counts["runtime_trials"] >= 3
            if faster == 1.0:
                assert counts["runtime_takeovers"] <= 1
            else:
                assert counts["runtime_takeovers"] == 1
                assert ran[-EXPLORE_EVERY:] == [RUNNER_UP] * EXPLORE_EVERY
