"""KV cache: the paged allocator's blocks grow with generated tokens and waste the tail of the
last block; an LLM batch's decode slows as its context grows and is scaled by the measured
efficiency; placement reserves the longest context in blocks and waits when none is left."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.backends.sim.calibration import ROOFLINE_EFFICIENCY
from hetero.backends.sim.timing import LlmSequences, modelled_run
from hetero.framework.fleet import simulated_devices
from hetero.framework.graph import BandwidthHint
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import Dispatch, Scheduler, StageTask, VirtualClock
from hetero.framework.simulator.kv import KvBatch, PagedKv
from hetero.framework.topology import Topology

POLICY = """\
version: 1
devices:
  simulated: [{name: a, preset: A100-SXM4-80GB, count: 1}]
stages:
  llm:
    modality: text
    variants:
      full: {flops_per_item: 11 TFLOPS, bytes_per_item: 14 GB, resident_bytes: 14 GB,
             kv_bytes_per_token: 524288, max_batch: 64, dtype: fp16}
routes: {/llm: llm}
scheduler: {memory_reserve_fraction: 0.0, kv_block_tokens: 16}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 1000}}
"""


def test_blocks_grow_with_generation_and_the_last_block_is_partly_empty() -> None:
    kv = PagedKv(block_tokens=16)
    batch = KvBatch(
        start=1.0,
        prefill_s=0.5,
        decode_s=1.0,
        prompts=np.array([20.0]),
        outputs=np.array([10.0]),
        bytes_per_token=2.0,
    )
    kv.add("d", batch)
    assert kv.usage("d", 0.5) == (0.0, 0.0)  # not started
    assert kv.usage("d", 1.2) == (2 * 16 * 2.0, 20 * 2.0)  # prompt: 2 blocks, 12 tokens empty
    assert kv.usage("d", 2.5) == (2 * 16 * 2.0, 30 * 2.0)  # 30 tokens: still 2 blocks
    kv.remove("d", batch)
    assert kv.usage("d", 2.5) == (0.0, 0.0)


def test_decode_reads_the_growing_cache_and_is_scaled_by_the_measured_efficiency() -> None:
    policy = load_policy_text(POLICY, "kv.yaml")
    device = simulated_devices(policy.spec.devices.simulated)[0]
    hint = BandwidthHint(
        11e12,
        14e9,
        resident_bytes=14 * 10**9,
        kv_bytes_per_token=524288,
        max_batch=64,
        dtype="fp16",
    )
    short = modelled_run(hint, device, 16, LlmSequences([100] * 16, [128] * 16, 768))
    long = modelled_run(hint, device, 16, LlmSequences([4000] * 16, [128] * 16, 768))
    assert long.decode_s > 1.5 * short.decode_s  # 16 x 4,000 tokens of KV read every step
    efficiency = ROOFLINE_EFFICIENCY["A100-SXM4-80GB"]
    weights_only = 128 * 14e9 / device.memory_bandwidth_bytes_per_s / efficiency.decode
    assert short.decode_s == pytest.approx(weights_only, rel=0.1)
    prefill = 16 * 100 * 11e12 / 768 / device.peak_flops_for("fp16") / efficiency.prefill
    assert short.prefill_s == pytest.approx(prefill)
    assert short.seconds == pytest.approx(20e-6 + short.prefill_s + short.decode_s)


def test_placement_reserves_whole_blocks_and_waits_when_the_cache_is_full() -> None:
    policy = load_policy_text(POLICY, "kv.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    scheduler = Scheduler(policy, devices, Topology(devices), VirtualClock())
    tokens = 30_000  # 30,000 tokens = 1,875 blocks = 15.7 GB of KV each
    placed = []
    while True:
        scheduler.enqueue(
            StageTask("r", "llm", "llm", "full", "standard", 0.0, 1.0, kv_tokens=tokens)
        )
        outcome = scheduler.dispatch()
        if outcome is None:
            break
        assert isinstance(outcome, Dispatch)
        placed.append(outcome)
    assert placed[0].kv_bytes == 1875 * 16 * 524288
    memory = scheduler.memory[0]
    assert len(placed) == (memory.capacity - 14 * 10**9) // placed[0].kv_bytes  # 4 fit
    scheduler.completed(placed[0], ok=True, run_s=1.0)
    assert memory.kv_reserved == (len(placed) - 1) * placed[0].kv_bytes
    assert isinstance(scheduler.dispatch(), Dispatch)  # room again for the waiting one
