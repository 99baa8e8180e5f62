"""The simulator tells the scheduler only what a server would know of a generation before it
runs: its prompt and the output length learnt from the stage's finished generations, never
the sequence's own length (the KV cache the scheduler reserves and places by)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import Scheduler, StageTask
from hetero.framework.simulator import load_workload, run
from hetero.framework.topology import Topology

POLICY = """\
version: 1
devices:
  simulated: [{name: a, preset: A100-SXM4-80GB, count: 2}]
stages:
  llm:
    modality: text
    variants:
      full: {flops_per_item: 11 TFLOPS, bytes_per_item: 14 GB, resident_bytes: 14 GB,
             kv_bytes_per_token: 524288, max_batch: 16, dtype: fp16}
routes: {/llm: llm}
scheduler: {memory_reserve_fraction: 0.0, kv_block_tokens: 16, batching: {llm: continuous}}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 10000}}
"""

WORKLOAD = """\
name: llm-lengths
seed: 1
duration_s: 20
arrivals: {kind: closed_loop, clients: 8, think_time_s: 0.0}
mix:
  - {route: /llm, text_tokens: 640, output_tokens: 100, weight: 0.5}
  - {route: /llm, text_tokens: 640, output_tokens: 300, weight: 0.5}
"""


def test_the_kv_reservation_assumes_the_learnt_length_not_the_true_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, int]] = []
    enqueue = Scheduler.enqueue

    def recording(self: Scheduler, task: StageTask) -> None:
        seen.append((task.kv_tokens, task.output_tokens))
        enqueue(self, task)

    monkeypatch.setattr(Scheduler, "enqueue", recording)
    policy = load_policy_text(POLICY, "llm.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    path = tmp_path / "workload.yaml"
    path.write_text(WORKLOAD)
    run.simulate(policy, devices, Topology(devices), load_workload(path))
    # Before any finished: the prompt alone. After: the prompt plus the learnt length, the
    # same for every sequence whatever it will generate (100 or 300 tokens).
    assert seen[0] == (640, 0)
    assert all(kv == 640 + out for kv, out in seen)
    learnt = {out for _, out in seen[-20:]}
    assert learnt and all(100 < out < 300 for out in learnt)
    # Control: the true lengths would make each sequence's reservation 740 or 940.
    assert not any(kv in (740, 940) for kv, _ in seen[-20:])
