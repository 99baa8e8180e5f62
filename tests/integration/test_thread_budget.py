"""A batch on the host's cores runs with the stage's intra-op threads while the cores have
nothing else to do, and on a copy of its graphs with half of them while another task shares
the cores (framework/engine/thread_budget.py); a stage whose neighbours have nothing on the
cores runs a further batch beside its first (the lane's core slots); real ONNX Runtime sessions
on this CPU, read back from the session each run used."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetero.framework.engine import Engine
from hetero.framework.engine.thread_budget import narrow_threads, narrows
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.stage_plugin import GraphRunner, StagePlugin

ORT_CPU = "npu:onnxruntime/CPUExecutionProvider"
POLICY = f"""\
version: 1
devices: {{allow: ["{ORT_CPU}"]}}
stages:
  held:
    modality: text
    variants:
      full: {{max_batch: 2, max_delay_ms: 0}}
  quick:
    modality: text
    variants:
      full: {{max_batch: 1}}
qos:
  default_class: standard
  classes: {{standard: {{weight: 1, sla_tier: t}}}}
sla_tiers: {{t: {{deadline_ms: 60000}}}}
"""
WIDTH = 16
THREADS = 2


def _matmul() -> bytes:
    weight = np.random.default_rng(5).standard_normal((WIDTH, WIDTH)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


class _Recording(StagePlugin):
    """Runs the MatMul and notes the intra-op threads of the session that ran it; a ``gate``
    holds each run until it is set (the stage stays in flight meanwhile). Batches of two, so
    the scheduler hands a lane a second task while its first runs."""

    batchable = True

    def __init__(self, name: str, gate: threading.Event | None = None) -> None:
        self.name = name
        self.gate = gate
        self.running = threading.Event()
        self.threads: list[int] = []
        self.started = threading.Semaphore(0)  # released as each run starts
        self.ended = threading.Event()  # set once a run has ended
        self.on_start: list[bool] = []  # per run: what ``watch`` said as it started
        self.watch: threading.Event | None = None

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        hint = BandwidthHint(2.0 * WIDTH * WIDTH, 4.0 * WIDTH * WIDTH, max_batch=2)
        return {"mm": ComputeGraph(f"{self.name}/mm", GraphFormat.ONNX, _matmul(), hint, ("x",))}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        session = runner.native("mm")
        self.threads.append(session.get_session_options().intra_op_num_threads)
        self.on_start.append(self.watch is not None and self.watch.is_set())
        self.running.set()
        self.started.release()
        if self.gate is not None:
            assert self.gate.wait(timeout=60), "the test never opened the gate"
        out = [runner.run("mm", {"x": np.asarray(p, np.float32)})["y"] for p in payloads]
        self.ended.set()
        return out


@pytest.fixture
def plugins() -> tuple[_Recording, _Recording]:
    return _Recording("held", gate=threading.Event()), _Recording("quick")


@pytest.fixture
def engine(plugins: tuple[_Recording, _Recording]) -> Iterator[Engine]:
    held, quick = plugins
    quick.gate = quick.gate or threading.Event()
    quick.gate.set()  # open unless a test closes it
    policy = load_policy_text(POLICY, "thread-budget.yaml")
    with Engine(
        policy,
        Registry(),
        plugins={"held": held, "quick": quick},
        threads={"held": THREADS, "quick": THREADS},
        probe=False,
    ) as running:
        running.warm_up()
        yield running
        for plugin in plugins:  # a failed assertion must not leave a run held while closing
            assert plugin.gate is not None
            plugin.gate.set()


def _x() -> np.ndarray:
    return np.ones((1, WIDTH), np.float32)


def test_a_run_alone_keeps_the_threads_and_one_beside_another_stages_run_gets_half(
    engine: Engine, plugins: tuple[_Recording, _Recording]
) -> None:
    held, quick = plugins
    engine.submit_stage("quick", _x()).result(timeout=60)
    assert quick.threads[-1] == THREADS  # the control: alone, the stage's own threads

    pending = engine.submit_stage("held", _x())  # stays in flight until the gate opens
    assert held.running.wait(timeout=60)
    engine.submit_stage("quick", _x()).result(timeout=60)
    assert quick.threads[-1] == narrow_threads(THREADS) == 1  # beside it: half

    assert held.gate is not None
    held.gate.set()
    pending.result(timeout=60)
    assert held.threads == [THREADS]  # it started alone
    engine.submit_stage("quick", _x()).result(timeout=60)
    assert quick.threads[-1] == THREADS  # alone again: the stage's own threads again


def test_only_runtimes_whose_threads_are_the_graphs_own_are_narrowed() -> None:
    devices = {d.id: d for d in Registry().backend("npu").devices()}
    ort = devices[ORT_CPU]
    assert narrows(ort, 2)
    assert not narrows(ort, 1)  # nothing to give up
    torch_cpu = devices["npu:torch/cpu"]  # its threads are the process's: a copy narrows both
    assert torch_cpu.on_host_cores
    assert not narrows(torch_cpu, 2)


def test_each_thread_count_is_a_copy_and_evicting_the_variant_releases_both() -> None:
    from hetero.framework.engine.device_models import DeviceModels

    backend = Registry().backend("npu")
    models = DeviceModels(backend, backend.device(ORT_CPU))
    plugin = _Recording("quick")
    try:
        for threads in (THREADS, 1, THREADS):
            models.run_batch(plugin, "quick/full", GraphFormat.ONNX, threads, [_x()])
        assert plugin.threads == [THREADS, 1, THREADS]
        assert len(backend.loaded_models(ORT_CPU)) == 2  # a copy per count, each kept
        models.evict("quick/full")
        assert not models.resident("quick/full")
        assert backend.loaded_models(ORT_CPU) == ()  # both released
    finally:
        models.close()


def _started(plugin: _Recording) -> None:
    assert plugin.started.acquire(timeout=60), f"no run of {plugin.name} started"


def _kept_back(lane: Any) -> None:
    """Wait until ``lane`` has received a task and keeps it back (one task waiting there)."""
    deadline = time.monotonic() + 60
    while lane.waiting() != 1:
        assert time.monotonic() < deadline, "the lane never received the second task"
        time.sleep(0.001)


def test_a_stage_alone_on_the_cores_runs_a_second_batch_beside_its_first(
    engine: Engine, plugins: tuple[_Recording, _Recording]
) -> None:
    held, _ = plugins
    first = engine.submit_stage("held", _x())  # held in its run until the gate opens
    _started(held)
    second = engine.submit_stage("held", _x())  # max_batch 1: a batch of its own
    _started(held)  # it started while the first was still running: a second core slot
    assert not held.ended.is_set()
    assert held.threads == [THREADS, narrow_threads(THREADS)]  # beside the first: half
    assert held.gate is not None
    held.gate.set()
    first.result(timeout=60)
    second.result(timeout=60)


def test_a_further_batch_waits_while_another_stage_has_work_on_the_cores(
    engine: Engine, plugins: tuple[_Recording, _Recording]
) -> None:
    held, quick = plugins
    assert quick.gate is not None and held.gate is not None
    quick.gate.clear()
    other = engine.submit_stage("quick", _x())  # another stage's run, held on the cores
    _started(quick)
    first = engine.submit_stage("held", _x())  # a lane's first batch always runs
    _started(held)
    held.watch = quick.ended  # each further held run notes whether quick's had ended
    second = engine.submit_stage("held", _x())
    _kept_back(engine._lanes[("held", ORT_CPU)])
    quick.gate.set()
    other.result(timeout=60)
    _started(held)  # beside the first (still held), once quick's work left the cores
    assert held.on_start == [False, True]
    assert not held.ended.is_set()
    held.gate.set()
    first.result(timeout=60)
    second.result(timeout=60)


def test_a_batch_is_split_in_consecutive_runs_as_even_as_they_go() -> None:
    from hetero.framework.engine.lanes import split_batch

    assert split_batch([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
    assert split_batch([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]
    assert split_batch([1], 2) == [[1]]  # one task: one run, however many slots are free
    assert split_batch([1, 2, 3], 1) == [[1, 2, 3]]


class _CountingInbox:
    """A lane's inbox that notes what is put in it (the lane's thread reads it as before)."""

    def __init__(self, inbox: Any) -> None:
        self.inbox = inbox
        self.puts: list[Any] = []

    def put(self, item: Any) -> None:
        self.puts.append(item)
        self.inbox.put(item)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inbox, name)


def test_a_task_for_a_lane_with_nothing_queued_starts_from_the_placing_thread(
    engine: Engine, plugins: tuple[_Recording, _Recording]
) -> None:
    from hetero.framework.scheduler import Dispatch

    held, quick = plugins
    assert quick.gate is not None and held.gate is not None
    held.gate.set()
    engine.submit_stage("held", _x()).result(timeout=60)  # the lane and its batcher exist
    lane = engine._lanes[("held", ORT_CPU)]
    inbox = _CountingInbox(lane.inbox)
    lane.inbox = inbox  # type: ignore[assignment]
    for _ in range(3):
        engine.submit_stage("held", _x()).result(timeout=60)
    assert inbox.puts == []  # no task and no wake-up went through the lane's thread
    assert held.threads[-3:] == [THREADS] * 3

    # the control: beside another stage's run, a second task waits in the lane's inbox (the
    # lane's thread keeps it back), and the end of the first run wakes that thread for it
    held.gate.clear()
    quick.gate.clear()
    other = engine.submit_stage("quick", _x())
    _started(quick)
    for _ in range(4):  # the runs above
        _started(held)
    first = engine.submit_stage("held", _x())
    _started(held)  # a lane's first batch always runs: from the placing thread too
    assert inbox.puts == []
    second = engine.submit_stage("held", _x())
    assert [type(item) for item in inbox.puts] == [Dispatch]
    _kept_back(lane)
    held.gate.set()
    first.result(timeout=60)
    second.result(timeout=60)
    assert len(inbox.puts) == 2 and not isinstance(inbox.puts[1], Dispatch)  # the wake-up
    quick.gate.set()
    other.result(timeout=60)
