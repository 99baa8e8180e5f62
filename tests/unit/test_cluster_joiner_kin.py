"""A device that joins a running fleet starts from the correction its kin measured
(``hetero.framework.scheduler.kin``, which ``Engine.add_devices`` calls for a Ray node's
devices): the scheduler on simulated devices and a virtual clock, as in test_scheduler.py."""

from __future__ import annotations

import dataclasses

from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import Dispatch, Scheduler, StageTask, VirtualClock
from hetero.framework.scheduler.kin import seed_from_kin
from hetero.framework.topology import Topology

POLICY = """\
version: 1
devices:
  simulated:
    - {name: a, preset: A100-SXM4-80GB, count: 1, host: left}
stages:
  vision:
    modality: image
    device_classes: [cuda]
    variants:
      full: {flops_per_item: 400 GFLOPS, bytes_per_item: 1 GB, resident_bytes: 2 GB,
             max_batch: 1, dtype: fp16}
pipelines:
  look: {steps: [{stage: vision}]}
routes: {/look: look}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 1000}}
"""


def test_a_joining_device_starts_from_its_kins_measured_correction() -> None:
    policy = load_policy_text(POLICY, "kin.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    scheduler = Scheduler(policy, devices, Topology(devices), VirtualClock())
    for _ in range(20):  # the A100 runs vision three times slower than the cost model says
        scheduler.enqueue(StageTask("r", "vision", "vision", "full", "standard", 0.0, 1.0))
        dispatch = scheduler.dispatch()
        assert isinstance(dispatch, Dispatch)
        scheduler.completed(dispatch, ok=True, run_s=3 * dispatch.decision.compute_s)
    tables = scheduler.tables["vision/full"]
    measured = float(tables.correction[0])
    assert measured > 2.0
    (old,) = devices
    kin = dataclasses.replace(old, id="sim:joined-0", host="right", links=())
    stranger = dataclasses.replace(old, id="sim:joined-1", host="right", vendor_name="other")
    scheduler.add_devices([kin, stranger], Topology([old, kin, stranger]))
    tables = scheduler.tables["vision/full"]
    assert list(tables.correction[1:]) == [1.0, 1.0]  # the control: the cost model alone
    assert seed_from_kin(scheduler, [kin, stranger]) == {"sim:joined-0": old.id}
    assert float(tables.correction[1]) == measured  # its kin's measured runs
    assert float(tables.correction[2]) == 1.0  # no kin: the cost model
    assert tables.unit_s[1] == tables.unit_s[0]


def test_a_joining_device_takes_the_twin_that_ran_each_stage() -> None:
    """Two identical devices were there, only the second ran the stage: the joiner starts
    from the second's correction, not the first's untouched 1."""
    policy = load_policy_text(POLICY.replace("count: 1", "count: 2"), "kin.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    scheduler = Scheduler(policy, devices, Topology(devices), VirtualClock())
    tables = scheduler.tables["vision/full"]
    tables.correction[1] = 3.0  # as the second's measured runs left it
    tables.refresh(1)
    first, second = devices
    joined = dataclasses.replace(first, id="sim:joined-0", host="right", links=())
    scheduler.add_devices([joined], Topology([first, second, joined]))
    assert seed_from_kin(scheduler, [joined]) == {"sim:joined-0": second.id}
    tables = scheduler.tables["vision/full"]
    assert float(tables.correction[2]) == 3.0
