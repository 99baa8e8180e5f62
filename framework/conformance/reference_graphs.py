"""Reference ONNX graphs for the conformance suite, built with ``onnx.helper``.

Several ops (MatMul, Gemm, Conv, pooling, normalisation, reductions, activations, broadcasting)
and shapes, each with deterministic inputs. Expected outputs come from ONNX Runtime on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat

__all__ = ["ReferenceGraph", "reference_graphs"]

OPSET = 17
IR_VERSION = 8


@dataclass(frozen=True, slots=True)
class ReferenceGraph:
    """A graph, its inputs, and how close a backend must come to ONNX Runtime's CPU results.

    Tolerances are for fp32 execution: ``rtol`` 1e-4 and ``atol`` 1e-5 unless a graph says
    otherwise (a backend that computes in bf16 fails them, as it should).
    """

    graph: ComputeGraph
    inputs: dict[str, np.ndarray[Any, Any]]
    rtol: float = 1e-4
    atol: float = 1e-5

    @property
    def torch_graph(self) -> ComputeGraph:
        """The same computation as a torch module factory, for devices without ONNX."""
        from hetero.framework.conformance.torch_reference import torch_factory

        assert isinstance(self.graph.source, bytes)
        short = self.graph.name.split("/", 1)[1]
        return ComputeGraph(
            self.graph.name + "/torch",
            GraphFormat.TORCH,
            torch_factory(short, self.graph.source),
            self.graph.hint,
        )

    def graph_for(self, accepts_onnx: bool) -> ComputeGraph:
        """The ONNX graph, or its torch twin where the device runs no ONNX."""
        return self.graph if accepts_onnx else self.torch_graph


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray[Any, Any]:
    return rng.standard_normal(shape).astype(np.float32)


def _model(
    name: str, nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any]
) -> bytes:
    from onnx import checker, helper

    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    checker.check_model(model)
    return bytes(model.SerializeToString())


def _mlp() -> ReferenceGraph:
    from onnx import TensorProto, helper, numpy_helper

    rng = _rng(1)
    inits = [
        numpy_helper.from_array(_f32(rng, 64, 32) * 0.1, "w1"),
        numpy_helper.from_array(_f32(rng, 32), "b1"),
        numpy_helper.from_array(_f32(rng, 32, 10) * 0.1, "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("ArgMax", ["logits"], ["label"], axis=-1, keepdims=0),
    ]
    source = _model(
        "mlp",
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
        ],
        inits,
    )
    hint = BandwidthHint(
        flops_per_item=2 * (64 * 32 + 32 * 10), bytes_per_item=4 * (64 * 32 + 32 * 10), max_batch=64
    )
    graph = ComputeGraph("conformance/mlp", GraphFormat.ONNX, source, hint)
    return ReferenceGraph(graph, {"x": _f32(rng, 4, 64)})


def _conv() -> ReferenceGraph:
    from onnx import TensorProto, helper, numpy_helper

    rng = _rng(2)
    inits = [
        numpy_helper.from_array(_f32(rng, 8, 3, 3, 3) * 0.2, "w"),
        numpy_helper.from_array(_f32(rng, 8), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["y"], axis=1),
    ]
    source = _model(
        "conv",
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        inits,
    )
    hint = BandwidthHint(
        flops_per_item=2 * 8 * 27 * 256, bytes_per_item=4 * (3 * 256 + 8 * 256), max_batch=2
    )
    graph = ComputeGraph("conformance/conv", GraphFormat.ONNX, source, hint)
    return ReferenceGraph(graph, {"x": _f32(rng, 2, 3, 16, 16)})


def _broadcast() -> ReferenceGraph:
    from onnx import TensorProto, helper

    rng = _rng(3)
    nodes = [
        helper.make_node("Mul", ["a", "b"], ["m"]),
        helper.make_node("Add", ["m", "c"], ["s"]),
        helper.make_node("Tanh", ["s"], ["t"]),
        helper.make_node("Sigmoid", ["t"], ["y"]),
        helper.make_node("Abs", ["s"], ["abs"]),
        helper.make_node("Sqrt", ["abs"], ["z"]),
    ]
    source = _model(
        "broadcast",
        nodes,
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, [3, 1]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3, 4]),
        ],
        [],
    )
    hint = BandwidthHint(flops_per_item=6 * 12, bytes_per_item=4 * 5 * 12, max_batch=2)
    graph = ComputeGraph("conformance/broadcast", GraphFormat.ONNX, source, hint)
    inputs = {"a": _f32(rng, 2, 3, 4), "b": _f32(rng, 4), "c": _f32(rng, 3, 1)}
    return ReferenceGraph(graph, inputs)


def _layernorm_gemm() -> ReferenceGraph:
    from onnx import TensorProto, helper, numpy_helper

    rng = _rng(4)
    inits = [
        numpy_helper.from_array(np.abs(_f32(rng, 16)) + 0.5, "gamma"),
        numpy_helper.from_array(_f32(rng, 16), "beta"),
        numpy_helper.from_array(_f32(rng, 24, 16) * 0.1, "w"),
        numpy_helper.from_array(_f32(rng, 24), "bias"),
        numpy_helper.from_array(np.array([-1, 16], dtype=np.int64), "flat"),
        numpy_helper.from_array(np.array([5, -1, 24], dtype=np.int64), "back"),
    ]
    nodes = [
        helper.make_node(
            "LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5
        ),
        helper.make_node("Reshape", ["n", "flat"], ["n2"]),
        helper.make_node("Gemm", ["n2", "w", "bias"], ["g"], transB=1),
        helper.make_node("Reshape", ["g", "back"], ["g3"]),
        helper.make_node("Transpose", ["g3"], ["y"], perm=[1, 0, 2]),
    ]
    source = _model(
        "layernorm_gemm",
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 7, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 5, 24])],
        inits,
    )
    hint = BandwidthHint(
        flops_per_item=2 * 7 * 16 * 24, bytes_per_item=4 * (7 * 16 + 24 * 16), max_batch=5
    )
    graph = ComputeGraph("conformance/layernorm_gemm", GraphFormat.ONNX, source, hint)
    return ReferenceGraph(graph, {"x": _f32(rng, 5, 7, 16)})


def _reductions() -> ReferenceGraph:
    from onnx import TensorProto, helper

    rng = _rng(5)
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=1),
        helper.make_node("ReduceMax", ["x"], ["max"], axes=[1], keepdims=1),
        helper.make_node("Sub", ["x", "mean"], ["centred"]),
        helper.make_node("Concat", ["mean", "max", "centred"], ["y"], axis=1),
    ]
    source = _model(
        "reductions",
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 9, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 11, 2])],
        [],
    )
    hint = BandwidthHint(flops_per_item=4 * 18, bytes_per_item=4 * 40, max_batch=3)
    graph = ComputeGraph("conformance/reductions", GraphFormat.ONNX, source, hint)
    return ReferenceGraph(graph, {"x": _f32(rng, 3, 9, 2)})


_BUILDERS: tuple[Callable[[], ReferenceGraph], ...] = (
    _mlp,
    _conv,
    _broadcast,
    _layernorm_gemm,
    _reductions,
)


def reference_graphs() -> dict[str, ReferenceGraph]:
    """Every reference graph by short name (``mlp``, ``conv``, ...)."""
    built = (build() for build in _BUILDERS)
    return {ref.graph.name.split("/", 1)[1]: ref for ref in built}


def onnxruntime_cpu_outputs(ref: ReferenceGraph) -> dict[str, np.ndarray[Any, Any]]:
    """What ONNX Runtime's CPU provider computes for ``ref``: the expected values."""
    from hetero.framework.executors.ort_executor import OrtExecutor

    assert isinstance(ref.graph.source, bytes)
    executor = OrtExecutor("CPUExecutionProvider")
    return executor.run(executor.session(ref.graph.source), ref.inputs)
