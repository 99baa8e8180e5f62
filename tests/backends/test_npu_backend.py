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
