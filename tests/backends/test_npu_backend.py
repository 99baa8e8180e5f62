"""npu-specific behaviour beyond the conformance suite: precision, files, formats, facts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hetero.backends.npu import NpuBackend
from hetero.backends.npu.host_facts import host_facts
from hetero.framework.conformance.reference_graphs import reference_graphs
from hetero.framework.errors import CompileError
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat

OPENVINO_CPU = "npu:openvino/CPU"
ORT_CPU = "npu:onnxruntime/CPUExecutionProvider"


@pytest.fixture(scope="module")
def backend() -> NpuBackend:
    return NpuBackend()


def matmul_graph(dtype: str) -> tuple[ComputeGraph, np.ndarray, np.ndarray]:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    weight = rng.standard_normal((256, 256)).astype(np.float32)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    hint = BandwidthHint(flops_per_item=2 * 256 * 256, bytes_per_item=4 * 256 * 256, dtype=dtype)
    return ComputeGraph(f"mm-{dtype}", GraphFormat.ONNX, model.SerializeToString(), hint), x, weight


def test_openvino_runs_fp32_graphs_in_f32_not_the_cpus_bf16_default(backend: NpuBackend) -> None:
    graph, x, weight = matmul_graph("fp32")
    model = backend.load(backend.compile(graph, OPENVINO_CPU))
    got = backend.run(model, {"x": x}).outputs["y"]
    backend.unload(model)
    assert np.max(np.abs(got - x @ weight)) < 1e-3


def test_a_bf16_graph_gets_the_bf16_hint(backend: NpuBackend) -> None:
    graph, x, weight = matmul_graph("bf16")
    model = backend.load(backend.compile(graph, OPENVINO_CPU))
    got = backend.run(model, {"x": x}).outputs["y"]
    backend.unload(model)
    flags = host_facts().cpu_flags
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        assert np.max(np.abs(got - x @ weight)) > 1e-3  # the control: bf16 really differs
    assert np.max(np.abs(got - x @ weight)) < 1.0


@pytest.mark.parametrize("device", [OPENVINO_CPU, ORT_CPU])
def test_onnx_file_on_disk(backend: NpuBackend, device: str, tmp_path: Path) -> None:
    ref = reference_graphs()["conv"]
    path = tmp_path / "conv.onnx"
    assert isinstance(ref.graph.source, bytes)
    path.write_bytes(ref.graph.source)
    graph = ComputeGraph("conv-file", GraphFormat.ONNX, path, ref.graph.hint)
    model = backend.load(backend.compile(graph, device))
    assert model.memory_bytes >= path.stat().st_size
    assert backend.run(model, ref.inputs).outputs["y"].shape == (2, 8)
    backend.unload(model)


@pytest.mark.parametrize("device", [OPENVINO_CPU, ORT_CPU])
def test_unsupported_sources_are_compile_errors(
    backend: NpuBackend, device: str, tmp_path: Path
) -> None:
    hint = BandwidthHint(flops_per_item=1, bytes_per_item=1)
    with pytest.raises(CompileError, match="not supported"):
        backend.compile(ComputeGraph("v", GraphFormat.VLLM, "some/model", hint), device)
    with pytest.raises(CompileError, match="not found"):
        backend.compile(ComputeGraph("f", GraphFormat.ONNX, tmp_path / "nope.onnx", hint), device)


def test_host_facts_are_plausible() -> None:
    facts = host_facts()
    assert facts.physical_cores >= 1
    assert facts.memory_bytes > 2**28
    assert facts.memory_bandwidth_bytes_per_s > 1e8
    assert facts.peak_flops["fp32"] > 1e9
    assert facts.peak_flops["int8"] >= facts.peak_flops["fp32"]


def _model(nodes: list[object], inputs: list[object], outputs: list[object], opset: int) -> bytes:
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs)  # type: ignore[arg-type]
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


@pytest.mark.parametrize("device", [OPENVINO_CPU, ORT_CPU])
def test_scalar_inputs_keep_their_shape(backend: NpuBackend, device: str) -> None:
    """A 0-d input stays 0-d (``np.ascontiguousarray`` made it shape (1,): ONNX Runtime then
    answered a wrong shape silently and OpenVINO failed)."""
    from onnx import TensorProto, helper

    scalar = [helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n in ("a", "b", "c")]
    source = _model([helper.make_node("Mul", ["a", "b"], ["c"])], scalar[:2], scalar[2:], 17)
    graph = ComputeGraph("scalar-mul", GraphFormat.ONNX, source, BandwidthHint(1, 4))
    model = backend.load(backend.compile(graph, device))
    result = backend.run(model, {"a": np.float32(2.0), "b": np.array(3.0, np.float32)})
    assert result.outputs["c"].shape == () and float(result.outputs["c"]) == 6.0


def test_openvino_errors_keep_their_cause(backend: NpuBackend) -> None:
    """OpenVINO's first line is a bare source locator; the cause is on the lines after it."""
    from onnx import TensorProto, helper

    text = [helper.make_tensor_value_info(n, TensorProto.STRING, [1]) for n in ("x", "y")]
    node = helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="LOWER")
    graph = ComputeGraph(
        "strings", GraphFormat.ONNX, _model([node], text[:1], text[1:], 10), BandwidthHint(1, 4)
    )
    with pytest.raises(CompileError) as caught:
        backend.load(backend.compile(graph, OPENVINO_CPU))
    message = str(caught.value)
    assert "StringNormalizer" in message, message
    assert "core.cpp" not in message
