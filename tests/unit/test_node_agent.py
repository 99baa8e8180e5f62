"""The node agent (what a Ray node runs) without Ray: discovery through the registered backends,
load, run and unload of a real ONNX graph on the npu backend's CPU devices."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from hetero.backends.npu import NpuBackend
from hetero.framework.cluster.agent import NodeAgent
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.registry import Detection, Registry

WEIGHT = np.arange(12, dtype=np.float32).reshape(3, 4)


def graph() -> ComputeGraph:
    onnx_graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[numpy_helper.from_array(WEIGHT, "w")],
    )
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    hint = BandwidthHint(flops_per_item=24, bytes_per_item=48)
    return ComputeGraph("mm", GraphFormat.ONNX, model.SerializeToString(), hint, input_names=("x",))


def test_the_agent_reports_its_devices_and_runs_graphs_on_them() -> None:
    registry = Registry(use_entry_points=False)
    registry.register_backend("npu", lambda: Detection.found("npu", NpuBackend))
    agent = NodeAgent(registry)
    devices = agent.devices()
    assert devices and all(spec.backend == "npu" for spec, _ in devices)
    onnx_devices = [spec for spec, formats in devices if GraphFormat.ONNX in formats]
    assert onnx_devices  # OpenVINO and ONNX Runtime take ONNX (a torch device would not)
    spec = onnx_devices[0]
    handle, memory_bytes = agent.load(graph(), spec.id)
    assert memory_bytes >= 0 and agent.resident() == 1
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(agent.run(handle, {"x": x}).outputs["y"], x @ WEIGHT)
    agent.unload(handle)
    agent.unload(handle)  # twice is fine
    assert agent.resident() == 0
