"""The bounded (branch-and-bound over hosts) placement search picks what the full scan picks.

Two schedulers on the same fleet, one costing every device per decision and one searching
hosts by their floors, are fed the same operations (tasks with inputs on random devices and
several items, dispatches, completions that move the measured corrections, health changes,
non-unit weights); every decision must name the same device with the same cost terms.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.framework.bench.scheduler import bench_policy
from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import placement
from hetero.framework.scheduler.clock import VirtualClock
from hetero.framework.scheduler.costs import FleetCosts
from hetero.framework.scheduler.scheduler import Dispatch, Scheduler
from hetero.framework.scheduler.tasks import OutputHandle, StageTask
from hetero.framework.topology import Topology

KINDS = ("A100-SXM4-80GB", "H100-SXM5-80GB", "MI300X", "Xeon-8480+")


def _policy(hosts: int, weights: tuple[float, float, float, float], batch: int) -> str:
    groups = "\n".join(
        f"    - {{name: g{i}, preset: {kind}, count: {2 + i % 2}, host: h{i}, hosts: {hosts}}}"
        for i, kind in enumerate(KINDS)
    )
    stages = "\n".join(
        f"  s{i}:\n    modality: text\n    variants:\n"
        f"      full: {{flops_per_item: {1 + 3 * i} GFLOPS, bytes_per_item: {10 + i} MB, "
        f"resident_bytes: {(50 + 400 * i)} MB, input_bytes: 1 MB, output_bytes: 1 MB, "
        f"max_batch: {batch + i}}}"
        for i in range(3)
    )
    queue, load, compute, transfer = weights
    return f"""version: 1
devices:
  simulated:
{groups}
stages:
{stages}
scheduler:
  weights: {{queue: {queue}, load: {load}, compute: {compute}, transfer: {transfer}}}
qos:
  default_class: standard
  classes:
    interactive: {{weight: 8, sla_tier: t, queue_bound: 100000}}
    standard: {{weight: 4, sla_tier: t, queue_bound: 100000}}
sla_tiers: {{t: {{deadline_ms: 1000}}}}
"""


operation = st.one_of(
    st.tuples(
        st.just("enqueue"),
        st.integers(0, 2),
        st.sampled_from(["interactive", "standard"]),
        st.integers(-2, 40),  # an input on that device (-1: none; -2: a device that left)
        st.integers(1, 3),
        st.sampled_from([1 << 10, 3 << 19, 1 << 25, 1 << 28]),  # input bytes
    ),
    st.tuples(st.just("dispatch")),
    st.tuples(st.just("complete"), st.integers(0, 50), st.floats(0.5, 3.0)),
    st.tuples(st.just("health"), st.integers(0, 40), st.booleans()),
)


NOT_A_DECISION = "not a decision"


def _apply(
    op: tuple[object, ...],
    clock: VirtualClock,
    scheduler: Scheduler,
    running: list[Dispatch],
    ids: list[str],
) -> object:
    """Carry ``op`` out on one scheduler; a dispatch returns what it decided."""
    clock.advance(0.01)
    if op[0] == "enqueue":
        _, stage, qos, source, items, size = op
        inputs: tuple[OutputHandle, ...] = ()
        if source == -2:
            inputs = (OutputHandle("gone:0", None, int(str(size))),)
        elif int(str(source)) >= 0:
            inputs = (OutputHandle(ids[int(str(source)) % len(ids)], None, int(str(size))),)
        now = clock.now()
        task = StageTask("r", f"s{stage}", f"s{stage}", "full", str(qos), now, now + 1, inputs)
        task.items = int(str(items))
        scheduler.enqueue(task)
    elif op[0] == "dispatch":
        outcome = scheduler.dispatch()
        if isinstance(outcome, Dispatch):
            running.append(outcome)
            return outcome.device_id, dataclasses.astuple(outcome.decision)[3:]
        return type(outcome).__name__
    elif op[0] == "complete" and running:
        done = running.pop(int(str(op[1])) % len(running))
        scheduler.completed(done, ok=True, run_s=done.decision.compute_s * float(str(op[2])))
    elif op[0] == "health":
        scheduler.set_health(ids[int(str(op[1])) % len(ids)], bool(op[2]))
    return NOT_A_DECISION


@settings(max_examples=60, deadline=None)
@given(
    hosts=st.integers(2, 5),
    weights=st.sampled_from([(1.0, 1.0, 1.0, 1.0), (0.5, 2.0, 1.0, 3.0), (1.0, 0.0, 1.0, 0.0)]),
    batch=st.integers(1, 3),
    outputs_on_host=st.booleans(),
    shared_cpus=st.booleans(),
    operations=st.lists(operation, min_size=5, max_size=120),
)
def test_bounded_search_places_every_task_where_the_full_scan_does(
    hosts: int,
    weights: tuple[float, float, float, float],
    batch: int,
    outputs_on_host: bool,
    shared_cpus: bool,
    operations: list[tuple[object, ...]],
) -> None:
    policy = load_policy_text(_policy(hosts, weights, batch), "bounded")
    devices = simulated_devices(policy.spec.devices.simulated)
    if shared_cpus:  # a host's CPU devices share its cores: their backlog is weighed together
        devices = [
            dataclasses.replace(d, properties={**d.properties, "shares_host_memory": True})
            if d.device_class.value == "cpu"
            else d
            for d in devices
        ]
    topology = Topology(devices)
    ids = [d.id for d in devices]
    pair = []
    for search in ("full", "bounded"):
        clock = VirtualClock()
        scheduler = Scheduler(
            policy, devices, topology, clock, search=search, outputs_on_host=outputs_on_host
        )
        pair.append((clock, scheduler, []))
    assert pair[1][1]._bounded_search and not pair[0][1]._bounded_search
    assert pair[1][1]._grouped == shared_cpus
    for op in operations:
        outcomes = [
            _apply(op, clock, scheduler, running, ids) for clock, scheduler, running in pair
        ]
        assert outcomes[0] == outcomes[1]
    # Drain what is left: every remaining decision must agree too.
    while True:
        outcomes = [s.dispatch() for _, s, _ in pair]
        if outcomes[0] is None or not isinstance(outcomes[0], Dispatch):
            assert type(outcomes[0]) is type(outcomes[1])
            break
        assert isinstance(outcomes[1], Dispatch)
        assert outcomes[0].device_id == outcomes[1].device_id
        assert outcomes[0].decision.estimate_s == outcomes[1].decision.estimate_s


def test_the_threshold_decides_the_search_and_add_devices_keeps_it() -> None:
    policy = bench_policy(64)
    devices = simulated_devices(policy.spec.devices.simulated)
    topology = Topology(devices)
    clock = VirtualClock()
    assert not Scheduler(policy, devices, topology, clock)._bounded_search  # 64 < threshold
    saved = placement.BOUNDED_SEARCH_MIN_DEVICES
    placement.BOUNDED_SEARCH_MIN_DEVICES = 64
    try:
        assert Scheduler(policy, devices, topology, clock)._bounded_search
        assert not Scheduler(policy, devices, topology, clock, search="full")._bounded_search
        # Round robin has nothing to bound.
        assert not Scheduler(
            policy, devices, topology, clock, placement="round_robin"
        )._bounded_search
    finally:
        placement.BOUNDED_SEARCH_MIN_DEVICES = saved
    one_host = [dataclasses.replace(d, host="solo") for d in devices[:8]]
    assert not Scheduler(
        policy, one_host, Topology(one_host), clock, search="bounded"
    )._bounded_search


def test_routes_to_and_remote_floors_agree_with_the_full_rows() -> None:
    specs = simulated_devices(bench_policy(64).spec.devices.simulated)
    fleet = FleetCosts(specs, Topology(specs), [d.memory_bytes for d in specs])
    fresh = FleetCosts(specs, Topology(specs), [d.memory_bytes for d in specs])
    targets = np.arange(64)
    for src in (0, 5, 17, 63):
        latency, inverse = fresh.routes_to(src, targets)  # no row kept: computed
        row_latency, row_inverse = fleet.routes_from(src)
        assert np.array_equal(latency, row_latency)
        assert np.array_equal(inverse, row_inverse)
        floor_latency, floor_inverse, near = fleet.remote_floor(src)
        remote = np.array([fleet.host_list[i] not in near for i in range(64)])
        assert remote.any() and not remote[src]
        assert (row_latency[remote] >= floor_latency).all()
        assert (row_inverse[remote] >= floor_inverse).all()
        size = 3 << 19
        assert (
            row_latency[remote] + size * row_inverse[remote] >= floor_latency + size * floor_inverse
        ).all()


def test_bounded_search_follows_devices_that_join_and_hints_that_change() -> None:
    policy = load_policy_text(_policy(4, (1.0, 1.0, 1.0, 1.0), 2), "bounded")
    devices = simulated_devices(policy.spec.devices.simulated)
    first, later = devices[: len(devices) // 2], devices[len(devices) // 2 :]
    pair = []
    for search in ("full", "bounded"):
        clock = VirtualClock()
        scheduler = Scheduler(policy, first, Topology(first), clock, search=search)
        pair.append((clock, scheduler))
    chosen: list[list[str]] = [[], []]

    def place(count: int, ids: list[str]) -> None:
        for n in range(count):
            for side, (clock, scheduler) in enumerate(pair):
                clock.advance(0.01)
                now = clock.now()
                source = (OutputHandle(ids[(7 * n) % len(ids)], None, 1 << 24),)
                stage = f"s{n % 3}"
                task = StageTask("r", stage, "x", "full", "standard", now, now + 1, source)
                scheduler.enqueue(task)
                outcome = scheduler.dispatch()
                assert isinstance(outcome, Dispatch)
                chosen[side].append(outcome.device_id)
                if n % 2:
                    scheduler.completed(outcome, ok=True, run_s=outcome.decision.compute_s * 2)

    place(30, [d.id for d in first])
    for _, scheduler in pair:
        scheduler.add_devices(later, Topology(devices))
        hint = scheduler.tables["s1/full"].costs.hint
        scheduler.set_hint(
            "s1", "full", dataclasses.replace(hint, flops_per_item=hint.flops_per_item / 8)
        )
    assert pair[1][1]._bounded_search
    place(60, [d.id for d in devices])
    assert chosen[0] == chosen[1]
    assert any(device in {d.id for d in later} for device in chosen[1][30:])  # newcomers used
