"""Data locality: a stage pinned to a site (require) runs only there, with a clear error where
no device satisfies it; a preferred zone is tried first and left when it cannot serve."""

from __future__ import annotations

import pytest

from hetero.framework.errors import NoEligibleDeviceError, PolicyError
from hetero.framework.fleet import resolve_fleet, simulated_devices
from hetero.framework.plan import plan_policy
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.scheduler import Dispatch, Rejection, Scheduler, StageTask, VirtualClock
from hetero.framework.topology import Topology

POLICY = """\
version: 1
devices:
  simulated:
    - {name: east, preset: A100-SXM4-80GB, count: 2, host: e0, site: east, zone: e-1}
    - {name: west, preset: A100-SXM4-80GB, count: 2, host: w0, site: west, zone: w-1}
stages:
  ids:
    modality: image
    locality: {site: east}
    variants: {full: {flops_per_item: 1 TFLOPS, bytes_per_item: 1 GB, resident_bytes: 50 GB}}
  chat:
    modality: text
    locality: {zone: w-1, mode: prefer}
    variants: {full: {flops_per_item: 1 TFLOPS, bytes_per_item: 1 GB, resident_bytes: 50 GB}}
routes: {/ids: ids, /chat: chat}
scheduler: {memory_reserve_fraction: 0.0}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 1000}}
"""


def make(text: str = POLICY) -> Scheduler:
    policy = load_policy_text(text, "locality.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    return Scheduler(policy, devices, Topology(devices), VirtualClock())


def task(stage: str) -> StageTask:
    return StageTask("r", stage, stage, "full", "standard", 0.0, 1.0)


def place(scheduler: Scheduler, stage: str) -> Dispatch:
    scheduler.enqueue(task(stage))
    outcome = scheduler.dispatch()
    assert isinstance(outcome, Dispatch)
    return outcome


def test_required_site_is_honoured_and_a_preferred_zone_yields_when_it_cannot_serve() -> None:
    scheduler = make()
    assert {place(scheduler, "ids").device_id for _ in range(2)} <= {"sim:east-0", "sim:east-1"}
    assert {place(scheduler, "chat").device_id for _ in range(2)} <= {"sim:west-0", "sim:west-1"}
    elsewhere = make()
    for device in ("sim:west-0", "sim:west-1"):
        elsewhere.set_health(device, False)
    assert place(elsewhere, "chat").device_id.startswith("sim:east")  # a preference yields
    for device in ("sim:west-0", "sim:west-1", "sim:east-0", "sim:east-1"):
        scheduler.set_health(device, device.startswith("sim:west"))
    scheduler.enqueue(task("ids"))
    assert isinstance(scheduler.dispatch(), Rejection)  # a requirement does not
    # Control: without the constraint the same placements may leave the site.
    free = make(POLICY.replace("    locality: {site: east}\n", ""))
    spots = {place(free, "ids").device_id for _ in range(1)}
    spots |= {place(free, "chat").device_id for _ in range(1)}
    assert spots & {"sim:west-0", "sim:west-1"}


def test_a_required_place_no_device_has_is_a_clear_error() -> None:
    text = POLICY.replace("locality: {site: east}", "locality: {site: north}")
    scheduler = make(text)
    scheduler.enqueue(task("ids"))
    outcome = scheduler.dispatch()
    assert isinstance(outcome, Rejection)
    assert isinstance(outcome.error, NoEligibleDeviceError)
    assert "requires site north (device: east)" in str(outcome.error)
    policy = load_policy_text(text, "locality.yaml")
    with pytest.raises(PolicyError, match=r"stages.ids.locality: no device satisfies it"):
        plan_policy(policy, resolve_fleet(policy, Registry(use_entry_points=False)))


def test_plan_lists_devices_outside_a_required_site_as_ineligible_and_preferred_first() -> None:
    policy = load_policy_text(POLICY, "locality.yaml")
    fleet = resolve_fleet(policy, Registry(use_entry_points=False))
    plans = {p.stage: p for p in plan_policy(policy, fleet)}
    assert {d for d, _ in plans["ids"].ineligible} == {"sim:west-0", "sim:west-1"}
    assert [c.device_id for c in plans["chat"].costs][:2] == ["sim:west-0", "sim:west-1"]
