"""A batch on the host's cores runs with the stage's intra-op threads while the cores have
nothing else to do, and on a copy of its graphs with half of them while another request shares
the cores (framework/engine/thread_budget.py); real ONNX Runtime sessions on this CPU, read
back from the session each run used."""

from __future__ import annotations

import threading
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
      full: {{max_batch: 1}}
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
    holds each run until it is set (the stage stays in flight meanwhile)."""

    def __init__(self, name: str, gate: threading.Event | None = None) -> None:
        self.name = name
        self.gate = gate
        self.running = threading.Event()
        self.threads: list[int] = []

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        hint = BandwidthHint(2.0 * WIDTH * WIDTH, 4.0 * WIDTH * WIDTH)
        return {"mm": ComputeGraph(f"{self.name}/mm", GraphFormat.ONNX, _matmul(), hint, ("x",))}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        session = runner.native("mm")
        self.threads.append(session.get_session_options().intra_op_num_threads)
        self.running.set()
        if self.gate is not None:
            assert self.gate.wait(timeout=60), "the test never opened the gate"
        return [runner.run("mm", {"x": np.asarray(p, np.float32)})["y"] for p in payloads]


@pytest.fixture
def plugins() -> tuple[_Recording, _Recording]:
    return _Recording("held", gate=threading.Event()), _Recording("quick")


@pytest.fixture
def engine(plugins: tuple[_Recording, _Recording]) -> Iterator[Engine]:
    held, quick = plugins
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
        assert held.gate is not None
        held.gate.set()  # a failed assertion must not leave a run held while the engine closes


def _x() -> np.ndarray:
    return np.ones((1, WIDTH), np.float32)


def test_a_run_alone_keeps_the_threads_and_one_beside_another_request_gets_half(
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
    from hetero.framework.engine.lanes import DeviceModels

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
