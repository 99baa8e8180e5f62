"""Fleet resolution (allow, deny, overrides, simulated devices) and roofline plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetero.framework.errors import PolicyError
from hetero.framework.fleet import resolve_fleet, simulated_devices
from hetero.framework.plan import cost_on, plan_policy
from hetero.framework.policy import load_policy, load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.stage_plugin import combined_hint, plugin_hints, stage_plugins
from hetero.models.embed import TextEmbedder

REPO = Path(__file__).resolve().parents[2]

SIM = """\
version: 1
devices:
  deny: ["sim:small-1"]
  overrides:
    "sim:big-0": {memory_bandwidth: 500 GB/s}
  simulated:
    - {name: big, class: cuda, vendor_name: Big, count: 2, memory: 80 GB,
       memory_bandwidth: 1000 GB/s, peak_flops: {fp32: 10 TFLOPS, fp16: 100 TFLOPS},
       interconnect: nvlink, interconnect_bandwidth: 300 GB/s, host_bandwidth: 25 GB/s}
    - {name: small, class: npu, vendor_name: Small, count: 2, memory: 1 GB,
       memory_bandwidth: 100 GB/s, peak_flops: {fp32: 1 TFLOPS}}
stages:
  enc:
    modality: image
    device_classes: [cuda, npu]
    variants:
      full: {flops_per_item: 1 TFLOPS, bytes_per_item: 1 GB, resident_bytes: 2 GB, dtype: fp16}
qos:
  default_class: s
  classes: {s: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 100}}
"""


def test_simulated_groups_become_linked_devices() -> None:
    policy = load_policy_text(SIM, "sim.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    assert [d.id for d in devices] == ["sim:big-0", "sim:big-1", "sim:small-0", "sim:small-1"]
    big0 = devices[0]
    assert [link.peer for link in big0.links] == ["sim:big-1"]
    assert big0.links[0].bandwidth_bytes_per_s == 300e9
    assert devices[2].links == ()


def test_deny_and_overrides_apply() -> None:
    fleet = resolve_fleet(load_policy_text(SIM, "sim.yaml"), Registry(use_entry_points=False))
    assert fleet.simulated
    ids = [d.id for d in fleet.devices]
    assert ids == ["sim:big-0", "sim:big-1", "sim:small-0"]
    assert dict(fleet.excluded)["sim:small-1"].startswith("denied")
    assert fleet.devices[0].memory_bandwidth_bytes_per_s == 500e9
    assert fleet.devices[1].memory_bandwidth_bytes_per_s == 1000e9


def test_plan_costs_are_the_roofline_and_ineligible_devices_say_why() -> None:
    policy = load_policy_text(SIM, "sim.yaml")
    (plan,) = plan_policy(policy, resolve_fleet(policy, Registry(use_entry_points=False)))
    costs = {c.device_id: c for c in plan.costs}
    # big-1: compute 1e12/100e12 = 10 ms, memory 1e9/1e12 = 1 ms -> compute-bound 10 ms
    assert costs["sim:big-1"].per_item_s == pytest.approx(0.010)
    assert costs["sim:big-1"].bound == "compute"
    assert costs["sim:big-1"].load_s == pytest.approx(2e9 / 25e9)
    # big-0 has its bandwidth overridden to 500 GB/s: memory 2 ms, still compute-bound
    assert costs["sim:big-0"].memory_s == pytest.approx(0.002)
    assert plan.costs[0].device_id == "sim:big-0"  # ties broken by id
    assert dict(plan.ineligible) == {"sim:small-0": "model does not fit beside the memory reserve"}


def test_default_policy_plans_on_this_hosts_cpu() -> None:
    policy = load_policy(REPO / "policies" / "default.yaml")
    registry = Registry()
    fleet = resolve_fleet(policy, registry)
    ids = {d.id for d in fleet.devices}
    assert {"npu:openvino/CPU", "npu:onnxruntime/CPUExecutionProvider"} <= ids
    assert {d.name for d in fleet.unavailable} >= {"cuda", "rocm"}
    hints = plugin_hints(policy, stage_plugins(registry))
    plans = plan_policy(policy, fleet, hints)
    assert all(plan.costs for plan in plans), "every stage has somewhere to run"
    # One source of cost: the plugin's graphs, not a second copy in the policy.
    embed = next(p for p in plans if (p.stage, p.variant) == ("text_embed", "full"))
    graphs = TextEmbedder().graphs("full")
    device = next(d for d in fleet.devices if d.id == embed.costs[0].device_id)
    assert embed.costs[0] == cost_on(combined_hint(graphs), device)
    with pytest.raises(PolicyError, match="flops_per_item and bytes_per_item are needed"):
        plan_policy(policy, fleet)  # the policy alone has no figures for these stages
