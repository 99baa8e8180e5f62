"""Continuous (iteration-level) batching of LLM stages in the simulator: a sequence joins at the
next decode step boundary, leaves at the end of the step that makes its last token, is timed by
the sim backend's one formula, and is preempted (recomputed) when the paged KV cache runs out;
and the memory-even placement that spreads continuously batched sequences over the devices."""

from __future__ import annotations

import runpy
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from hetero.backends.sim.timing import LlmSequences, modelled_prefill, modelled_run, modelled_steps
from hetero.framework.devices import DeviceSpec
from hetero.framework.fleet import simulated_devices
from hetero.framework.graph import BandwidthHint
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import Dispatch, Scheduler, StageTask, VirtualClock
from hetero.framework.simulator import load_workload, simulate
from hetero.framework.simulator.decode import DecodeEngine, DecodeSequence
from hetero.framework.topology import Topology

POLICY = """\
version: 1
devices:
  simulated: [{{name: a, preset: A100-SXM4-80GB, count: {count}}}]
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
sla_tiers: {{t: {{deadline_ms: 100000}}}}
"""

HINT = BandwidthHint(
    11e12, 14e9, resident_bytes=14 * 10**9, kv_bytes_per_token=524288, max_batch=16, dtype="fp16"
)


def _policy(count: int = 1, batching: str = "continuous"):  # type: ignore[no-untyped-def]
    return load_policy_text(POLICY.format(count=count, batching=batching), "llm.yaml")


def _fixed_engine(
    *, prefill_s: float = 1.0, step_s: float = 0.1, budget_tokens: int = 4, cap: int = 16
) -> tuple[DecodeEngine[str], list[list[int]]]:
    """An engine with fixed step times; the list records every prefill's contexts."""
    prefills: list[list[int]] = []

    def prefill(contexts: Sequence[int]) -> float:
        prefills.append(list(contexts))
        return prefill_s

    def steps(contexts: Sequence[int], remaining: Sequence[int]) -> np.ndarray:
        return np.full(max(remaining), step_s)

    engine: DecodeEngine[str] = DecodeEngine(
        max_running=cap,
        block_tokens=budget_tokens,
        bytes_per_token=1.0,
        prefill_s=prefill,
        steps_s=steps,
    )
    return engine, prefills


def test_a_lone_sequence_takes_exactly_what_the_static_formula_gives_it() -> None:
    device = simulated_devices(_policy().spec.devices.simulated)[0]
    engine: DecodeEngine[str] = DecodeEngine(
        max_running=16,
        block_tokens=16,
        bytes_per_token=HINT.kv_bytes_per_token,
        prefill_s=lambda prompts: modelled_prefill(HINT, device, prompts, 768),
        steps_s=lambda c, r: modelled_steps(HINT, device, c, r, 768),
    )
    engine.add(DecodeSequence("a", 640, 128))
    prefill = engine.next_work(0.0, 10**6)
    assert prefill is not None and prefill.kind == "prefill"
    assert engine.finish() == []
    decode = engine.next_work(prefill.end, 10**6)
    assert decode is not None and decode.kind == "decode" and len(decode.ends) == 128
    done = engine.finish()
    assert [s.item for s in done] == ["a"] and not engine.has_work
    static = modelled_run(HINT, device, 1, LlmSequences([640], [128], 768))
    assert decode.end == pytest.approx(static.seconds, rel=1e-12)
    assert prefill.end == pytest.approx(20e-6 + static.prefill_s, rel=1e-12)


def test_a_request_joins_at_the_next_step_boundary_and_leaves_when_its_tokens_are_done() -> None:
    engine, prefills = _fixed_engine(budget_tokens=16)
    engine.add(DecodeSequence("a", 16, 10))
    assert engine.next_work(0.0, 100) is not None
    engine.finish()  # a prefilled at 1.0
    window = engine.next_work(1.0, 100)
    assert window is not None and window.end == pytest.approx(2.0)  # 10 steps of 0.1 s
    engine.add(DecodeSequence("b", 16, 10))  # arrives mid-step, at 1.25
    assert engine.wants_step_boundary()
    generation = engine.generation
    assert engine.truncate(1.25) == pytest.approx(1.3)  # the step in progress finishes
    assert engine.generation != generation  # the old end's timer is stale
    assert engine.tokens(1.25).tolist() == [16 + 2]  # two steps done at 1.25
    assert engine.finish() == []
    assert engine.running[0].generated == 3
    join = engine.next_work(1.3, 100)
    assert join is not None and join.kind == "prefill" and join.end == pytest.approx(2.3)
    assert prefills == [[16], [16]]  # b's prefill alone; a waits for it
    engine.finish()
    window = engine.next_work(2.3, 100)
    assert window is not None and window.end == pytest.approx(3.0)  # until a's last token
    done = engine.finish()
    assert [s.item for s in done] == ["a"]
    assert [(s.item, s.generated) for s in engine.running] == [("b", 7)]
    assert done[0].mean_batch == pytest.approx((3 * 1 + 7 * 2) / 10)


def test_the_batch_cap_holds_the_rest_in_the_queue() -> None:
    engine, _ = _fixed_engine(cap=2)
    for name in "abc":
        engine.add(DecodeSequence(name, 4, 5))
    work = engine.next_work(0.0, 100)
    assert work is not None and [s.item for s in work.joining] == ["a", "b"]
    engine.finish()
    assert not engine.wants_step_boundary()  # c waits: the batch is full
    assert [s.item for s in engine.waiting] == ["c"]


def test_kv_running_out_preempts_the_youngest_which_is_recomputed_later() -> None:
    engine, prefills = _fixed_engine(budget_tokens=4)  # blocks of 4 tokens
    engine.add(DecodeSequence("a", 4, 8))
    engine.add(DecodeSequence("b", 4, 8))
    budget = 4  # blocks
    assert engine.next_work(0.0, budget) is not None
    engine.finish()
    window = engine.next_work(1.0, budget)
    assert window is not None and len(window.ends) == 4  # 2 x 8 tokens fill the 4 blocks
    engine.finish()
    window = engine.next_work(1.4, budget)  # the next token needs a fifth block
    assert engine.preemptions == 1
    assert [s.item for s in engine.waiting] == ["b"] and engine.waiting[0].preemptions == 1
    assert window is not None and len(window.ends) == 4  # a alone, to its end
    assert [s.item for s in engine.finish()] == ["a"]
    again = engine.next_work(1.8, budget)
    assert again is not None and again.kind == "prefill"
    assert prefills[-1] == [8]  # b's prompt and its 4 generated tokens are recomputed


def _workload(tmp_path: Path, rate: float) -> Path:
    path = tmp_path / "workload.yaml"
    path.write_text(
        "name: llm\nseed: 3\nduration_s: 30\nwarmup_s: 5\n"
        f"arrivals: {{kind: poisson, rate_per_s: {rate}}}\n"
        "nominal: {text_tokens: 768}\n"
        "mix:\n  - {route: /llm, weight: 1, text_tokens: 640, output_tokens: 128}\n"
    )
    return path


def test_continuous_batching_cuts_first_token_waits_against_static(tmp_path: Path) -> None:
    workload = load_workload(_workload(tmp_path, 3.0))
    figures = {}
    for batching in ("continuous", "static"):
        policy = _policy(1, batching)
        devices = simulated_devices(policy.spec.devices.simulated)
        figures[batching] = simulate(policy, devices, Topology(devices), workload).summary()
    continuous, static = figures["continuous"], figures["static"]
    # A static batch makes a request that arrives while it runs wait for its end; a
    # continuous one takes it in at the next step.
    assert continuous["ttft_p50_ms"] < 0.5 * static["ttft_p50_ms"]
    assert continuous["throughput_rps"] > static["throughput_rps"]
    assert continuous["kv_preemptions"] == 0  # the scheduler reserved each longest context


def test_continuous_batching_is_deterministic(tmp_path: Path) -> None:
    workload = load_workload(_workload(tmp_path, 8.0))
    policy = _policy(2)
    devices = simulated_devices(policy.spec.devices.simulated)
    runs = [simulate(policy, devices, Topology(devices), workload).summary() for _ in range(2)]
    for run in runs:
        run.pop("wall_s")
        run.pop("cpu_s")
    assert runs[0] == runs[1]


def _place(scheduler: Scheduler, count: int) -> list[Dispatch]:
    placed = []
    for _ in range(count):
        scheduler.enqueue(
            StageTask("r", "llm", "llm", "full", "standard", 0.0, 100.0, kv_tokens=768)
        )
        outcome = scheduler.dispatch()
        assert isinstance(outcome, Dispatch)
        placed.append(outcome)
    return placed


def test_memory_even_placement_spreads_sequences_and_replicates_the_model() -> None:
    policy = _policy(2)
    devices = simulated_devices(policy.spec.devices.simulated)
    scheduler = Scheduler(policy, devices, Topology(devices), VirtualClock())
    assert scheduler.preload(devices[0].id, "llm/full")
    placed = _place(scheduler, 6)
    where = [d.device_id for d in placed]
    # The first goes where the model is; the next finds the other device with room and
    # less memory in use after taking it: a replica loads there, and the sequences alternate.
    assert where[:2] == [devices[0].id, devices[1].id] and placed[1].load.load
    assert where.count(devices[0].id) == where.count(devices[1].id) == 3
    used = [m.used for m in scheduler.memory]
    assert used[0] == used[1] == 14 * 10**9 + 3 * placed[0].kv_bytes


def test_control_static_llm_batching_packs_one_device() -> None:
    policy = _policy(2, "static")
    devices = simulated_devices(policy.spec.devices.simulated)
    scheduler = Scheduler(policy, devices, Topology(devices), VirtualClock())
    assert scheduler.preload(devices[0].id, "llm/full")
    where = [d.device_id for d in _place(scheduler, 6)]
    assert where == [devices[0].id] * 6  # a forming batch is cheapest to join


def _llm_everywhere(count: int) -> tuple[list[DeviceSpec], VirtualClock, Scheduler]:
    """``count`` devices with the LLM resident on each, and the scheduler's clock."""
    policy = _policy(count)
    devices = simulated_devices(policy.spec.devices.simulated)
    clock = VirtualClock()
    scheduler = Scheduler(policy, devices, Topology(devices), clock)
    for device in devices:
        assert scheduler.preload(device.id, "llm/full")
    return devices, clock, scheduler


def test_a_models_sequences_go_to_the_device_given_one_least_recently() -> None:
    devices, clock, scheduler = _llm_everywhere(3)
    where = []
    for second in range(6):  # one at a time: memory is even again before each
        clock.advance_to(float(second))
        (placed,) = _place(scheduler, 1)
        where.append(placed.device_id)
        scheduler.completed(placed, ok=True, run_s=1.0)
    # Each device's batch takes sequences of every age instead of a cohort at once.
    assert sorted(where[:3]) == sorted(d.id for d in devices)
    assert where[3:] == where[:3]


def _two_short(gap_s: float) -> tuple[list[str], list[str]]:
    """Three devices with two sequences each; the first device's two finish, then two more
    arrive ``gap_s`` apart. The device ids, and where the two new ones go."""
    devices, clock, scheduler = _llm_everywhere(3)
    running = _place(scheduler, 6)
    assert sorted(d.device_id for d in running) == sorted([d.id for d in devices] * 2)
    clock.advance_to(1.0)
    for dispatch in running:
        if dispatch.device_id == devices[0].id:
            scheduler.completed(dispatch, ok=True, run_s=1.0)
    where = []
    for second in (1.0, 1.0 + gap_s):
        clock.advance_to(second)
        (placed,) = _place(scheduler, 1)
        where.append(placed.device_id)
    return [d.id for d in devices], where


def test_a_device_is_not_given_two_sequences_within_one_prefill() -> None:
    # 11 TFLOPs at the A100's 312 TFLOP/s: one request's compute is 35 ms.
    ids, where = _two_short(0.01)
    # The emptied device takes the first; the second, 10 ms later, would pile its prefill
    # onto the first's there (and the two would grow and leave as a cohort): it goes on.
    assert where[0] == ids[0] and where[1] != ids[0]


def test_control_sequences_a_prefill_apart_both_go_where_memory_is_least() -> None:
    ids, where = _two_short(0.05)
    assert where == [ids[0], ids[0]]  # memory-even alone: the emptied device is least used


BIG = """\
  big:
    modality: text
    variants:
      full: {flops_per_item: 1 TFLOPS, bytes_per_item: 1 GB, resident_bytes: 70 GB,
             max_batch: 1, dtype: fp16}
"""


def _paced_beside_a_big_model(release_it: bool) -> tuple[list[str], list[str], Scheduler]:
    """Two devices: the LLM resident on the first, an idle 70 GB model on the second (the LLM
    fits there only by evicting it, unless ``release_it``); two sequences 10 ms apart."""
    text = POLICY.format(count=2, batching="continuous").replace("stages:\n", "stages:\n" + BIG)
    policy = load_policy_text(text.replace("{/llm: llm}", "{/llm: llm, /big: big}"), "big.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    clock = VirtualClock()
    scheduler = Scheduler(policy, devices, Topology(devices), clock)
    assert scheduler.preload(devices[0].id, "llm/full")
    assert scheduler.preload(devices[1].id, "big/full")
    if release_it:
        assert scheduler.release(devices[1].id, "big/full")
    where = []
    for second in (100.0, 100.01):  # past every minimum residency: the big model may go
        clock.advance_to(second)
        (placed,) = _place(scheduler, 1)
        where.append(placed.device_id)
    return [d.id for d in devices], where, scheduler


def test_pacing_never_evicts_another_model() -> None:
    ids, where, scheduler = _paced_beside_a_big_model(release_it=False)
    assert where == [ids[0], ids[0]]  # a 35 ms stall, rather than evicting 70 GB for a replica
    assert scheduler.tables["big/full"].resident[1]


def test_control_pacing_takes_a_replica_where_memory_is_free() -> None:
    ids, where, scheduler = _paced_beside_a_big_model(release_it=True)
    assert where == [ids[0], ids[1]]
    assert scheduler.tables["llm/full"].resident.all()


ENCODER = """\
  enc:
    modality: text
    variants:
      full: {flops_per_item: 1 TFLOPS, bytes_per_item: 1 GB, resident_bytes: 2 GB,
             max_batch: 8, dtype: fp16}
"""


def _with_encoder(batching: str) -> Scheduler:
    text = POLICY.format(count=2, batching=batching).replace("stages:\n", "stages:\n" + ENCODER)
    text = text.replace("routes: {/llm: llm}", "routes: {/llm: llm, /enc: enc}")
    policy = load_policy_text(text, "enc.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    scheduler = Scheduler(policy, devices, Topology(devices), VirtualClock())
    for device in devices:
        assert scheduler.preload(device.id, "llm/full")
        assert scheduler.preload(device.id, "enc/full")
    _place(scheduler, 2)  # a sequence running on each device
    return scheduler


def _encode(scheduler: Scheduler, count: int) -> list[str]:
    where = []
    for _ in range(count):
        scheduler.enqueue(StageTask("r", "enc", "enc", "full", "standard", 0.0, 100.0))
        outcome = scheduler.dispatch()
        assert isinstance(outcome, Dispatch)
        where.append(outcome.device_id)
    return where


def test_other_stages_batches_spread_over_devices_running_a_continuous_batch() -> None:
    scheduler = _with_encoder("continuous")
    where = _encode(scheduler, 6)
    # Each of these batches stalls the sequences running where it goes: spread evenly.
    assert where.count(scheduler.devices[0].id) == where.count(scheduler.devices[1].id) == 3


def _encode_one_at_a_time(scheduler: Scheduler, count: int) -> list[str]:
    """Encoder tasks placed and finished one after another: in-flight counts tie each time."""
    where = []
    for second in range(count):
        scheduler.clock.advance_to(1.0 + second)  # type: ignore[attr-defined]
        scheduler.enqueue(StageTask("r", "enc", "enc", "full", "standard", 0.0, 100.0))
        outcome = scheduler.dispatch()
        assert isinstance(outcome, Dispatch)
        where.append(outcome.device_id)
        scheduler.completed(outcome, ok=True, run_s=0.0)  # no measured time: no correction
    return where


def test_other_stages_tasks_take_turns_over_devices_with_equal_work_in_flight() -> None:
    scheduler = _with_encoder("continuous")
    first, second = (d.id for d in scheduler.devices)
    # The cost model alone sends each to the first device (equal estimates, lowest index):
    # its sequences would take every stall. In turn, each device's take the same share.
    assert _encode_one_at_a_time(scheduler, 4) == [first, second, first, second]


def test_control_with_static_llm_batching_the_cost_model_keeps_them_on_one_device() -> None:
    scheduler = _with_encoder("static")
    first = scheduler.devices[0].id
    assert _encode_one_at_a_time(scheduler, 4) == [first] * 4  # no turn: equal estimates


def test_control_fewer_tasks_in_flight_still_outranks_the_turn() -> None:
    scheduler = _with_encoder("continuous")
    first, second = (d.id for d in scheduler.devices)
    (placed,) = _place(scheduler, 1)
    assert placed.device_id == first  # two sequences there, one on the second device
    assert _encode_one_at_a_time(scheduler, 3) == [second] * 3


def test_the_spread_loads_a_replica_where_memory_is_free() -> None:
    scheduler = _with_encoder("continuous")
    first, second = scheduler.devices
    assert scheduler.release(second.id, "enc/full")  # the encoder only on the first device
    where = _encode(scheduler, 2)
    assert where == [first.id, second.id]  # a replica loads where memory is free
    assert scheduler.tables["enc/full"].resident.all()


def test_the_ref_8xa100_mean_bound_is_the_documented_one() -> None:
    script = (
        Path(__file__).resolve().parents[2] / "benchmarks" / "scenarios" / "ref_8xa100_bound.py"
    )
    figures = runpy.run_path(str(script))["bound"]()
    assert figures["mean_bound_s"] == pytest.approx(1.81, abs=0.005)  # docs/simulator.md
    assert figures["mean_bound_s"] == figures["little_bound_s"] > figures["own_work_bound_s"]
    assert figures["llm_alone_s"] == pytest.approx(1.639, abs=0.001)
