"""The simulator's admission counts a continuously batched LLM device as its batch cap of runs
at once: a fleet of continuous batches is not judged as serial runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import Scheduler, VirtualClock
from hetero.framework.scheduler.request_admission import RequestAdmission
from hetero.framework.simulator import load_workload, run
from hetero.framework.simulator.admission import SimAdmission
from hetero.framework.topology import Topology

POLICY = """\
version: 1
devices:
  simulated: [{{name: a, preset: A100-SXM4-80GB, count: 2}}]
stages:
  llm:
    modality: text
    variants:
      full: {{flops_per_item: 11 TFLOPS, bytes_per_item: 14 GB, resident_bytes: 14 GB,
             kv_bytes_per_token: 524288, max_batch: 16, dtype: fp16}}
routes: {{/llm: llm}}
scheduler: {{memory_reserve_fraction: 0.0, kv_block_tokens: 16, batching: {{llm: {batching}}}}}
qos:
  default_class: standard
  classes: {{standard: {{weight: 1, sla_tier: t}}}}
sla_tiers: {{t: {{deadline_ms: 10000}}}}
"""

WORKLOAD = """\
name: llm-closed
seed: 1
duration_s: 20
arrivals: {kind: closed_loop, clients: 24, think_time_s: 0.0}
mix:
  - {route: /llm, text_tokens: 640, output_tokens: 128}
"""


def _simulate(tmp_path: Path, batching: str = "continuous") -> dict[str, object]:
    policy = load_policy_text(POLICY.format(batching=batching), "llm.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    path = tmp_path / "workload.yaml"
    path.write_text(WORKLOAD)
    return run.simulate(policy, devices, Topology(devices), load_workload(path)).summary()


def test_continuous_llm_devices_count_their_batch_cap_as_runs_at_once() -> None:
    for batching, slots in (("continuous", 32), ("static", 2)):
        policy = load_policy_text(POLICY.format(batching=batching), "llm.yaml")
        devices = simulated_devices(policy.spec.devices.simulated)
        scheduler = Scheduler(policy, devices, Topology(devices), VirtualClock())
        assert SimAdmission(policy, scheduler).run_slots("llm") == slots


def test_24_sequences_on_two_continuous_batches_of_16_are_admitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 24 sequences fit the two devices' 32 places: each takes about 3 s, within the 10 s
    # deadline, so nothing is shed.
    assert _simulate(tmp_path)["shed"] == 0
    # Control: judged as one run per device, 24 sequences of 3 s look like 34 s of queue.
    monkeypatch.setattr(run, "SimAdmission", RequestAdmission)
    assert _simulate(tmp_path)["shed"] > 0  # type: ignore[operator]
