"""What a Ray node runs, without Ray: the node agent's discovery through the registered backends,
and a lane actor's load, run and evict of a real ONNX graph (a bare-graph stage) on the npu
backend's CPU devices, with the sizes and shapes it reports to the front door."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from hetero.backends.npu import NpuBackend
from hetero.framework.cluster.agent import NodeAgent
from hetero.framework.cluster.lane_actor import LaneActor
from hetero.framework.engine.graph_stage import GraphStage
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
    lane = LaneActor(GraphStage("mm", {"full": graph()}), spec.id, registry)
    assert lane.ready() and lane.load("mm/full", GraphFormat.ONNX, 0)
    assert lane.models.resident("mm/full")
    x = np.ones((2, 3), np.float32)
    (load_s, run_s, shapes), kept = lane.run("mm/full", GraphFormat.ONNX, 0, [{"x": x}])
    assert load_s == 0.0 and run_s > 0  # it was resident already
    assert shapes == [("map", {"y": (2 * 4 * 4, (2, 4))})]
    np.testing.assert_allclose(kept[0]["y"], x @ WEIGHT)
    lane.evict("mm/full")
    lane.evict("mm/full")  # twice is fine
    assert not lane.models.resident("mm/full")
