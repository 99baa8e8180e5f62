"""Issue 36, fourth session: what a server knows of a generation before it runs, used three
ways. Admission sheds a sequence that would miss its deadline on the device placement would
give it (learnt lengths and learnt measured-over-predicted times, :mod:`sequence_admission`);
placement weighs a sequence's own completion at the long end of the learnt lengths; another
stage's task counts the wait for a decode step in progress. Each with a control that flips."""

from __future__ import annotations

import pytest

from hetero.framework.errors import ShedError
from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import Dispatch, Scheduler, StageTask, VirtualClock
from hetero.framework.scheduler.output_lengths import (
    MIN_TIMED,
    PENDING,
    OutputLengths,
    SequenceTimes,
)
from hetero.framework.scheduler.request_admission import RequestAdmission
from hetero.framework.scheduler.sequence_admission import sequence_completion_s
from hetero.framework.topology import Topology

POLICY = """\
version: 1
devices:
  simulated: [{devices}]
stages:
  llm:
    modality: text
    variants:
      full: {{flops_per_item: 11 TFLOPS, bytes_per_item: 14 GB, resident_bytes: 14 GB,
             kv_bytes_per_token: 524288, max_batch: 16, dtype: fp16}}
  embed:
    modality: text
    variants:
      full: {{flops_per_item: 56 GFLOPS, bytes_per_item: 0.5 GB, resident_bytes: 450 MB,
             max_batch: 64, dtype: fp16}}
routes: {{/llm: llm, /embed: embed}}
scheduler: {{memory_reserve_fraction: 0.0, kv_block_tokens: 16, batching: {{llm: continuous}}}}
qos:
  default_class: standard
  classes: {{standard: {{weight: 1, sla_tier: t}}}}
sla_tiers: {{t: {{deadline_ms: {deadline_ms}}}}}
"""

A100 = "{name: a, preset: A100-SXM4-80GB, count: 1}"
MI300X = "{name: m, preset: MI300X, count: 1}"
ASCEND = "{name: n, preset: Ascend-910B, count: 1}"


def _scheduler(devices: str, deadline_ms: int = 100000) -> tuple[list[str], Scheduler]:
    policy = load_policy_text(POLICY.format(devices=devices, deadline_ms=deadline_ms), "p.yaml")
    specs = simulated_devices(policy.spec.devices.simulated)
    scheduler = Scheduler(policy, specs, Topology(specs), VirtualClock())
    for device in specs:
        for key in ("llm/full", "embed/full"):
            if scheduler.tables[key].costs.runnable[scheduler.fleet.index[device.id]]:
                assert scheduler.preload(device.id, key)
    return [d.id for d in specs], scheduler


def _sequence(output_tokens: int, deadline: float = 100.0) -> StageTask:
    task = StageTask("r", "llm", "llm", "full", "standard", 0.0, deadline, kv_tokens=768)
    task.output_tokens = output_tokens
    return task


def _place(scheduler: Scheduler, task: StageTask) -> Dispatch:
    scheduler.enqueue(task)
    outcome = scheduler.dispatch()
    assert isinstance(outcome, Dispatch)
    return outcome


def _learn(lengths: OutputLengths, tokens: list[int], ratio: float | None) -> None:
    for count in tokens:
        lengths.observe("llm", count)
    if ratio is not None:
        for task_id in range(MIN_TIMED):
            lengths.times.placed(task_id + 1_000_000, "llm", 1.0, 0.0)
            lengths.times.finished(task_id + 1_000_000, ratio)


def test_lengths_keep_their_tenth_and_90th_percentiles() -> None:
    lengths = OutputLengths()
    assert lengths.short("llm") == lengths.long("llm") == 0
    for tokens in [70] * 40 + [128] * 30 + [408] * 30:
        lengths.observe("llm", tokens)
    assert (lengths.short("llm"), lengths.long("llm")) == (70, 408)


def test_measured_over_predicted_is_trusted_after_enough_sequences() -> None:
    times = SequenceTimes()
    for task_id in range(MIN_TIMED - 1):
        times.placed(task_id, "llm", 1.0, 10.0)
        times.finished(task_id, 12.0)
    assert times.ratio("llm") is None
    times.placed(99, "llm", 1.0, 10.0)
    times.dropped(99)  # cancelled: not timed
    times.finished(99, 50.0)
    assert times.ratio("llm") is None
    times.placed(100, "llm", 1.0, 10.0)
    times.finished(100, 12.0)
    assert times.ratio("llm") == pytest.approx(2.0)


def test_sequences_never_reported_done_are_forgotten_oldest_first() -> None:
    times = SequenceTimes()
    for task_id in range(PENDING + 10):
        times.placed(task_id, "llm", 1.0, 0.0)
    assert len(times._pending) == PENDING and 9 not in times._pending
    assert PENDING + 9 in times._pending


@pytest.mark.parametrize("deadline_ms, shed", [(1500, True), (100000, False)])
def test_admission_sheds_a_sequence_that_misses_where_placement_would_put_it(
    deadline_ms: int, shed: bool
) -> None:
    # 128 tokens alone on an A100: about 0.9 s by the roofline, twice that as measured: a
    # 1.5 s deadline is missed wherever it goes; the control's 100 s is not.
    _, scheduler = _scheduler(A100, deadline_ms)
    _learn(scheduler.output_lengths, [128] * 20, ratio=2.0)
    admission = RequestAdmission(scheduler.policy, scheduler)
    probe = _sequence(128, deadline=deadline_ms / 1000)
    done_in = sequence_completion_s(scheduler, probe, 0.0)
    assert done_in is not None and 1.5 < done_in < 100
    if shed:
        with pytest.raises(ShedError):
            admission.admit("llm", "standard", sequence=probe)
    else:
        assert admission.admit("llm", "standard", sequence=probe).variant == "full"


def test_control_nothing_is_shed_before_the_times_are_learnt() -> None:
    _, scheduler = _scheduler(A100, 1500)
    _learn(scheduler.output_lengths, [128] * 20, ratio=None)
    probe = _sequence(128, deadline=1.5)
    assert sequence_completion_s(scheduler, probe, 0.0) is None
    admission = RequestAdmission(scheduler.policy, scheduler)
    assert admission.admit("llm", "standard", sequence=probe).variant == "full"


def _mi300x_with_running(tokens: list[int], running: int) -> tuple[list[str], Scheduler]:
    ids, scheduler = _scheduler(f"{A100}, {MI300X}")
    _learn(scheduler.output_lengths, tokens, ratio=None)
    index = scheduler.fleet.index[ids[1]]
    tables = scheduler.tables["llm/full"]
    tables.pending[index] = running  # sequences already there
    tables.refresh(index)
    return ids, scheduler


@pytest.mark.parametrize("long_tail, where", [(True, 1), (False, 0)])
def test_a_sequence_is_placed_as_if_it_might_turn_out_long(long_tail: bool, where: int) -> None:
    # 15 sequences on the MI300X: a 20-token sequence finishes sooner on the idle A100 (its
    # prefill stalls and theirs outweigh the bandwidth), but where one generation in ten of
    # the stage ran to 2,000 tokens, at that length the MI300X's bandwidth finishes it
    # sooner despite the others. Control: lengths that never run long.
    tokens = [20] * 80 + ([2000] * 20 if long_tail else [20] * 20)
    ids, scheduler = _mi300x_with_running(tokens, running=15)
    assert _place(scheduler, _sequence(20)).device_id == ids[where]


@pytest.mark.parametrize("decoding, where", [(True, 1), (False, 0)])
def test_a_small_task_counts_the_decode_step_it_would_wait_for(decoding: bool, where: int) -> None:
    # An embedding is about three times slower on the Ascend NPU than on the MI300X, but the
    # MI300X is decoding: the task would wait for half a step there, longer than it runs.
    ids, scheduler = _scheduler(f"{MI300X}, {ASCEND}")
    if decoding:
        _learn(scheduler.output_lengths, [128] * 20, ratio=None)
        _place(scheduler, _sequence(128))
    task = StageTask("e", "embed", "embed", "full", "standard", 0.0, 100.0)
    assert _place(scheduler, task).device_id == ids[where]
