"""What the npu backend needs from each runtime library (OpenVINO, ONNX Runtime, torch)."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hetero.framework.devices import DeviceClass
from hetero.framework.graph import ComputeGraph, GraphFormat

__all__ = ["Runtime", "onnx_bytes_or_path", "serialized_size"]


class Runtime(abc.ABC):
    """One runtime library behind the npu backend, over its executor."""

    name: ClassVar[str]
    formats: ClassVar[frozenset[GraphFormat]] = frozenset({GraphFormat.ONNX})

    @abc.abstractmethod
    def local_devices(self) -> list[tuple[str, DeviceClass, str, dict[str, Any]]]:
        """``(local id, class, vendor name, properties)`` for every device the runtime offers."""

    @abc.abstractmethod
    def compile(self, graph: ComputeGraph, local_id: str) -> Any:
        """Read and check the graph for the device, without making it resident."""

    @abc.abstractmethod
    def load(self, prepared: Any, graph: ComputeGraph, local_id: str) -> Any:
        """Make the graph resident and return a runnable native object."""

    @abc.abstractmethod
    def run(
        self, loaded: Any, inputs: dict[str, np.ndarray[Any, Any]]
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Run and return outputs by name."""

    def native(self, loaded: Any) -> Any:
        """The runtime's own object behind ``loaded``."""
        return loaded

    def resident_bytes(self, loaded: Any) -> int:
        """Bytes ``loaded`` certainly holds (weights it can count), a floor for accounting."""
        return 0

    def unload(self, loaded: Any) -> None:  # noqa: B027 - optional hook
        """Release what ``loaded`` holds beyond dropping the reference."""


def onnx_bytes_or_path(graph: ComputeGraph) -> bytes | str:
    """The ONNX source as bytes or a path string; other formats are refused here."""
    if graph.format is not GraphFormat.ONNX:
        raise ValueError(f"graph format {graph.format.value!r} is not supported (onnx only)")
    source = graph.source
    if isinstance(source, bytes):
        return source
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"ONNX file not found: {path}")
        return str(path)
    raise ValueError("an ONNX graph's source must be bytes or a path")


def serialized_size(source: bytes | str) -> int:
    """Bytes of the serialized model, a floor for its resident weights."""
    return len(source) if isinstance(source, bytes) else Path(source).stat().st_size
