"""Placement of an LLM sequence by added completion time, with the guard for one that turns
out long (``ResidencyMixin._fast_enough_if_long``): a device that would finish a sequence of
the stage's long length later even with the device to itself than another candidate as that
one is now is left out, so a sequence goes to a slower, idle device only once the faster one
is loaded enough that a long one would finish no sooner there."""

from __future__ import annotations

from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import Dispatch, Scheduler, StageTask, VirtualClock
from hetero.framework.topology import Topology

POLICY = """\
version: 1
devices:
  simulated:
    - {name: h, preset: H100-SXM5-80GB, count: 1}
    - {name: m, preset: MI300X, count: 1}
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
sla_tiers: {t: {deadline_ms: 100000}}
"""


def _devices(scheduler: Scheduler, count: int, kv_tokens: int) -> str:
    """Where ``count`` sequences of 128 expected tokens go, one letter a device (h, m)."""
    where = []
    for _ in range(count):
        task = StageTask("r", "llm", "llm", "full", "standard", 0.0, 100.0, kv_tokens=kv_tokens)
        task.output_tokens = 128
        scheduler.enqueue(task)
        outcome = scheduler.dispatch()
        assert isinstance(outcome, Dispatch)
        where.append(outcome.device_id.removeprefix("sim:")[0])
    return "".join(where)


def _learnt(long: bool) -> Scheduler:
    """An H100 and an MI300X; with ``long``, half the stage's finished sequences were 408
    tokens long (its long length, :meth:`OutputLengths.long`), half 70."""
    policy = load_policy_text(POLICY, "llm.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    scheduler = Scheduler(policy, devices, Topology(devices), VirtualClock())
    for device in devices:
        assert scheduler.preload(device.id, "llm/full")
    if long:
        for index in range(64):
            scheduler.output_lengths.observe("llm", 408 if index % 2 else 70)
        assert scheduler.output_lengths.long("llm") == 408
    return scheduler


def test_long_guard_keeps_sequences_off_the_slower_device_while_the_fast_one_would_win() -> None:
    # 768 tokens of KV cache each: even a full batch of 16 on the MI300X (5.3 TB/s) finishes
    # a 408-token sequence sooner than an idle H100 (3.35 TB/s), so all 16 go there and the
    # H100 takes only what the MI300X has no room for.
    assert _devices(_learnt(long=True), 20, kv_tokens=768) == "m" * 16 + "h" * 4


def test_control_without_a_long_length_the_added_cost_sends_the_eighth_to_the_h100() -> None:
    # The added completion time alone (nothing finished yet, no long length known) spares
    # the seven sequences on the MI300X by sending the eighth to the idle H100.
    where = _devices(_learnt(long=False), 20, kv_tokens=768)
    assert where[:7] == "m" * 7 and where[7] == "h"


def test_long_guard_lets_the_slower_device_in_once_the_fast_one_is_loaded_enough() -> None:
    # With 2,048 tokens of KV cache each the MI300X's steps grow faster: after 8 there, a long
    # one would finish no sooner on it than on the idle H100, which then takes sequences
    # again before the MI300X is full (the guard narrows, it does not pin).
    guarded = _devices(_learnt(long=True), 20, kv_tokens=2048)
    unguarded = _devices(_learnt(long=False), 20, kv_tokens=2048)
    assert guarded.index("h") == 8 > unguarded.index("h")
    assert guarded.count("m") < 16
