"""Bandwidth-hinted compute graphs: a stage's model in a form a backend can compile."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BandwidthHint", "ComputeGraph", "GraphFormat"]


class GraphFormat(enum.StrEnum):
    """How :attr:`ComputeGraph.source` is to be read."""

    ONNX = "onnx"  # bytes of a ModelProto, or a path to a .onnx file
    OPENVINO_IR = "openvino_ir"  # path to an .xml file with its .bin beside it
    TORCH = "torch"  # a zero-argument factory returning a torch.nn.Module
    VLLM = "vllm"  # a model id or path for vLLM


@dataclass(frozen=True, slots=True)
class BandwidthHint:
    """What one item of work costs, for the roofline cost model.

    Attributes:
        flops_per_item: Floating point operations per item.
        bytes_per_item: Bytes read and written in device memory per item.
        input_bytes: Bytes of one item's input (what a transfer moves in).
        output_bytes: Bytes of one item's output (what the next stage receives).
        resident_bytes: Device memory the loaded model occupies (weights plus workspace).
        batchable: Whether items can be stacked into one run.
        max_batch: Largest batch the graph accepts.
        dtype: Arithmetic precision, to pick the device's peak FLOP/s.
        kv_bytes_per_token: KV-cache bytes one token of context holds while a request runs
            (an LLM's ``2 x layers x kv_heads x head_dim x dtype bytes``; 0 for a model with
            no KV cache). Placement reserves it per request in blocks; the simulator grows it
            with prompt plus generated tokens.
    """

    flops_per_item: float
    bytes_per_item: float
    input_bytes: int = 0
    output_bytes: int = 0
    resident_bytes: int = 0
    batchable: bool = True
    max_batch: int = 1
    dtype: str = "fp32"
    kv_bytes_per_token: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "flops_per_item",
            "bytes_per_item",
            "input_bytes",
            "output_bytes",
            "kv_bytes_per_token",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.resident_bytes < 0:
            raise ValueError("resident_bytes must not be negative")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {self.max_batch}")
        if not self.batchable and self.max_batch != 1:
            raise ValueError("a graph that is not batchable has max_batch 1")

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved; above a device's ridge point the graph is compute-bound."""
        if self.bytes_per_item == 0:
            return float("inf")
        return self.flops_per_item / self.bytes_per_item

    def roofline_seconds(self, peak_flops: float, bandwidth_bytes_per_s: float) -> float:
        """Time for one item: the slower of compute and memory traffic."""
        return max(self.flops_per_item / peak_flops, self.bytes_per_item / bandwidth_bytes_per_s)

    def batch_seconds(self, peak_flops: float, bandwidth_bytes_per_s: float, batch: float) -> float:
        """Roofline time of a batch: compute scales with it; of the memory traffic, the weights
        (``min(resident_bytes, bytes_per_item)``) are read once per batch and the rest per item.
        This is why batching helps memory-bound stages (LLM decode) and not compute-bound ones;
        a batch of one is :meth:`roofline_seconds`. ``batch`` may be fractional: items of
        different sizes add up to a number of nominal items."""
        batch = max(batch, 0.0)
        shared = min(self.resident_bytes, self.bytes_per_item)
        traffic = shared + batch * (self.bytes_per_item - shared)
        return max(batch * self.flops_per_item / peak_flops, traffic / bandwidth_bytes_per_s)


@dataclass(frozen=True, slots=True)
class ComputeGraph:
    """A model a backend can compile, plus its cost hint.

    Attributes:
        name: Stable name (stage and variant), used in logs, errors and metrics.
        format: How ``source`` is read.
        source: ONNX bytes or a path, an IR path, a torch module factory, or a model id.
        hint: The cost hint.
        input_names: Input names in order, where the format does not carry them.
        metadata: Free-form facts (model version, preprocessing parameters).
        threads: Intra-op threads the runtime may use for it on a CPU (0: its default).
        helper: A small helper of a stage's main graphs (a voice-activity detector) that runs
            on the host CPU beside them, wherever they are placed.
    """

    name: str
    format: GraphFormat
    source: bytes | str | Path | Callable[[], Any]
    hint: BandwidthHint
    input_names: tuple[str, ...] = ()
    metadata: tuple[tuple[str, str], ...] = ()
    threads: int = 0
    helper: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", GraphFormat(self.format))
        if self.threads < 0:
            raise ValueError(f"graph {self.name!r}: threads must not be negative")
        if self.format is GraphFormat.TORCH and not callable(self.source):
            raise ValueError(f"graph {self.name!r}: a torch graph's source must be a factory")
