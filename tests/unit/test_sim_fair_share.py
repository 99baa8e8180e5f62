"""The simulator admits requests as the engine does: every stage of a request judged at its
arrival, tenants held to their fair share of each stage."""

from __future__ import annotations

from pathlib import Path

from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.scheduler.request_admission import RequestAdmission
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.metrics import RunMetrics
from hetero.framework.simulator.run import _Simulation

POLICY = """\
version: 1
devices:
  simulated:
    - {name: g, preset: H100-SXM5-80GB, count: 1, host: a}
stages:
  llm:
    modality: text
    variants:
      full: {flops_per_item: 200 TFLOPS, bytes_per_item: 30 GB, resident_bytes: 20 GB,
             max_batch: 1, dtype: fp16}
pipelines:
  chat: {steps: [{stage: llm}]}
routes: {/chat: chat}
qos:
  default_class: standard
  classes:
    standard: {weight: 1, sla_tier: t, queue_bound: 12}
    quiet: {weight: 1, sla_tier: t, queue_bound: 12}
sla_tiers: {t: {deadline_ms: 600000}}
"""

# One tenant sends nine requests in ten, more than the device serves; the other sends one.
WORKLOAD = """\
name: two-tenants
seed: 7
duration_s: 60
arrivals: {kind: poisson, rate_per_s: 40}
mix:
  - {route: /chat, weight: 9, text_tokens: 300, output_tokens: 50, TENANT_FLOOD}
  - {route: /chat, weight: 1, qos: quiet, text_tokens: 300, output_tokens: 50, TENANT_QUIET}
"""


def _run(tmp_path: Path, tenants: bool) -> tuple[RunMetrics, _Simulation]:
    text = WORKLOAD.replace(", TENANT_FLOOD", ", tenant: flood" if tenants else "")
    text = text.replace(", TENANT_QUIET", ", tenant: quiet" if tenants else "")
    path = tmp_path / f"workload-{tenants}.yaml"
    path.write_text(text)
    policy = load_policy_text(POLICY, "sim.yaml")
    fleet = resolve_fleet(policy, Registry(use_entry_points=False))
    simulation = _Simulation(
        policy, fleet.devices, fleet.topology(), load_workload(path), "cost_model", "cost_aware"
    )
    return simulation.run(), simulation


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_a_flooding_tenant_is_held_to_its_share_so_the_other_waits_less(tmp_path: Path) -> None:
    held, simulation = _run(tmp_path, tenants=True)
    free, _ = _run(tmp_path, tenants=False)  # the control: nobody named, no shares
    assert isinstance(simulation.admission, RequestAdmission)  # the engine's own class
    assert held.offered_by_class == free.offered_by_class  # the same arrivals
    assert held.offered_by_class["quiet"] > 200 and held.shed > 1000  # over capacity
    quiet_held = held.latencies_by_class["quiet"]
    quiet_free = free.latencies_by_class["quiet"]
    assert len(quiet_held) > 0.9 * held.offered_by_class["quiet"]
    # the flood holds its share of the stage, not the whole queue: the quiet tenant's
    # requests wait behind half as much (virtual time: the figures repeat exactly)
    assert _mean(quiet_held) < 0.6 * _mean(quiet_free)
    assert simulation.admission.shares.held("llm", "flood") == 0  # all given back at the end
    assert simulation.admission.shares.held("llm", "quiet") == 0
