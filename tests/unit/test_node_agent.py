"""What a Ray node runs, without Ray: the node agent's discovery through the registered backends,
and a device actor's load, run and evict of real ONNX graphs (bare-graph stages) on the npu
backend's CPU devices: small results answered inline, large ones kept in the actor and read
in place by the next stage on the same device, released when the front door drops them."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from hetero.backends.npu import NpuBackend
from hetero.framework.cluster.agent import NodeAgent
from hetero.framework.cluster.kept import KeptStore
from hetero.framework.cluster.lane_actor import LaneActor
from hetero.framework.cluster.stand_ins import KeptBatch, RayOutput
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
    lane = LaneActor(spec.id, registry=registry)
    lane.add_stage("mm", GraphStage("mm", {"full": graph()}))
    assert lane.ready() and lane.load("mm/full", GraphFormat.ONNX, 0)
    assert lane.models.resident("mm/full")
    x = np.ones((2, 3), np.float32)
    load_s, run_s, shapes, batch_id, lost = lane.run("mm/full", GraphFormat.ONNX, 0, [{"x": x}])
    assert load_s == 0.0 and run_s > 0 and lost == {}  # it was resident already
    ((kind, value),) = shapes
    assert kind == "inline" and batch_id is None  # 32 bytes travel back with the answer
    np.testing.assert_allclose(value["y"], x @ WEIGHT)
    assert lane.kept_stats()["batches"] == 0
    lane.evict("mm/full")
    lane.evict("mm/full")  # twice is fine
    assert not lane.models.resident("mm/full")


WIDE = 32_768  # a row of 128 KiB: more than an answer carries inline


def wide_graph(name: str, weight: np.ndarray, src: str, dst: str) -> ComputeGraph:
    onnx_graph = helper.make_graph(
        [helper.make_node("MatMul", [src, "w"], [dst])],
        name,
        [helper.make_tensor_value_info(src, TensorProto.FLOAT, ["N", weight.shape[0]])],
        [helper.make_tensor_value_info(dst, TensorProto.FLOAT, ["N", weight.shape[1]])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    hint = BandwidthHint(flops_per_item=2 * weight.size, bytes_per_item=4 * weight.size)
    return ComputeGraph(name, GraphFormat.ONNX, model.SerializeToString(), hint, input_names=(src,))


def two_stage_lane(seed: int) -> tuple[LaneActor, str, np.ndarray, np.ndarray]:
    """A device actor on an ONNX CPU device holding ``make`` (x -> a wide h, kept) and ``use``
    (h -> y, inline), with its fleet id and the two weights."""
    registry = Registry(use_entry_points=False)
    registry.register_backend("npu", lambda: Detection.found("npu", NpuBackend))
    spec = next(s for s, formats in NodeAgent(registry).devices() if GraphFormat.ONNX in formats)
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((3, WIDE)).astype(np.float32)
    w2 = (rng.standard_normal((WIDE, 2)) / WIDE).astype(np.float32)
    fleet_id = f"{spec.id}@node-x"
    lane = LaneActor(spec.id, fleet_id, registry)
    lane.add_stage("make", GraphStage("make", {"full": wide_graph("make", w1, "x", "h")}))
    lane.add_stage("use", GraphStage("use", {"full": wide_graph("use", w2, "h", "y")}))
    return lane, fleet_id, w1, w2


def test_large_outputs_stay_in_the_actor_and_the_next_stage_reads_them_in_place() -> None:
    lane, fleet_id, w1, w2 = two_stage_lane(0)
    x = np.ones((1, 3), np.float32)
    _, _, shapes, batch_id, _ = lane.run("make/full", GraphFormat.ONNX, 0, [{"x": x}])
    assert shapes == [("map", {"h": (WIDE * 4, (1, WIDE))})] and batch_id is not None
    assert lane.kept_stats() == {"batches": 1, "bytes": WIDE * 4, "served": 0, "dropped": 0}
    # The front door's stand-in, as it would reach this actor in the next stage's payload.
    batch = KeptBatch(None, batch_id, fleet_id)
    h = RayOutput(batch, 0, "h", WIDE * 4, (1, WIDE))
    _, _, (used,), _, _ = lane.run("use/full", GraphFormat.ONNX, 0, [{"h": h}])
    assert used[0] == "inline"
    np.testing.assert_allclose(used[1]["y"], (x @ w1) @ w2, rtol=1e-4)
    assert lane.kept_stats()["served"] == 0  # read in place: nothing was copied out
    np.testing.assert_allclose(lane.pick(batch_id, [(0, "h")])[0], x @ w1)  # a reader elsewhere
    lane.release(batch_id)
    assert lane.kept_stats()["batches"] == 0 and lane.pick(batch_id, [(0, "h")]) is None
    # Gone before its reader came: the run answers LOST (the engine makes it again).
    assert lane.run("use/full", GraphFormat.ONNX, 0, [{"h": h}])[0] == "lost"


def test_in_a_batch_only_the_items_whose_kept_inputs_are_gone_are_lost() -> None:
    """Two items read two kept batches, one dropped: that item is answered lost (its producer
    runs again) and the other runs; the control: both kept, both run."""
    lane, fleet_id, w1, w2 = two_stage_lane(1)
    xs = [np.full((1, 3), value, np.float32) for value in (1.0, 2.0)]
    made = []
    for x in xs:  # one kept batch per item
        batch_id = lane.run("make/full", GraphFormat.ONNX, 0, [{"x": x}])[3]
        batch = KeptBatch(None, batch_id, fleet_id)
        made.append((batch_id, {"h": RayOutput(batch, 0, "h", WIDE * 4, (1, WIDE))}))
    payloads = [payload for _, payload in made]
    _, _, shapes, _, lost = lane.run("use/full", GraphFormat.ONNX, 0, payloads)
    assert lost == {} and len(shapes) == 2  # the control
    lane.release(made[0][0])
    _, _, shapes, _, lost = lane.run("use/full", GraphFormat.ONNX, 0, payloads)
    assert list(lost) == [0] and "dropped" in lost[0]
    ((kind, value),) = shapes  # the second item alone ran
    assert kind == "inline"
    np.testing.assert_allclose(value["y"], (xs[1] @ w1) @ w2, rtol=1e-4)


def test_the_kept_store_drops_the_oldest_batches_past_its_bound() -> None:
    store = KeptStore(limit_bytes=100)
    for index in range(4):
        store.keep(f"b{index}", [np.zeros(10, np.float32)], 40)
    assert store.get("b0") is None and store.get("b1") is None  # 160 > 100: the oldest went
    assert store.get("b2") is not None and store.get("b3") is not None
    assert store.stats() == {"batches": 2, "bytes": 80, "served": 0, "dropped": 2}
