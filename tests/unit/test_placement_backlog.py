"""The backlog placement adds per device: a continuously batched LLM sequence adds nothing (a
later task waits one step, not its whole decode); a batch of any other stage adds its
estimate."""

from __future__ import annotations

import pytest

from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import Dispatch, Scheduler, StageTask, VirtualClock
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
  vision:
    modality: image
    variants:
      full: {{flops_per_item: 400 GFLOPS, bytes_per_item: 1 GB, resident_bytes: 2 GB,
             max_batch: 8, dtype: fp16}}
routes: {{/llm: llm, /see: vision}}
scheduler: {{memory_reserve_fraction: 0.0, kv_block_tokens: 16, batching: {{llm: {batching}}}}}
qos:
  default_class: standard
  classes: {{standard: {{weight: 1, sla_tier: t}}}}
sla_tiers: {{t: {{deadline_ms: 10000}}}}
"""


def _place(scheduler: Scheduler, stage: str, number: int) -> Dispatch:
    task = StageTask(f"r{number}", stage, stage, "full", "standard", 0.0, 10.0, kv_tokens=768)
    scheduler.enqueue(task)
    outcome = scheduler.dispatch()
    assert isinstance(outcome, Dispatch), outcome
    return outcome


@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_llm_sequences_weigh_on_the_backlog_only_when_batched_statically(batching: str) -> None:
    policy = load_policy_text(POLICY.format(batching=batching), "backlog.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    scheduler = Scheduler(policy, devices, Topology(devices), VirtualClock())
    sequences = [_place(scheduler, "llm", n) for n in range(6)]
    vision = _place(scheduler, "vision", 99)
    assert scheduler.backlog.sum() == pytest.approx(
        sum(d.backlog_s for d in sequences) + vision.backlog_s
    )
    decision = vision.decision  # a batch adds its estimate: load, compute, transfer
    assert vision.backlog_s == pytest.approx(decision.estimate_s - decision.queue_s)
    if batching == "continuous":
        assert all(d.backlog_s == 0.0 for d in sequences)
        assert vision.decision.queue_s == 0.0  # nothing it waits behind
    else:  # control: a static batch waits for the sequences placed before it
        assert all(d.backlog_s > 0.0 for d in sequences)
        assert vision.decision.queue_s > 0.0
