"""What the GPU backends share: torch modules on ``cuda:N`` (HIP devices appear as ``cuda:N``
in ROCm builds of torch) and ONNX graphs on ONNX Runtime's GPU provider, with static-shape graph
capture. :class:`GpuBackend` leaves discovery and telemetry (NVML, amdsmi) to its subclasses."""

from __future__ import annotations

import abc
import logging
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hetero.framework.backend import Arrays, Backend, Executable, LoadedModel
from hetero.framework.executors.ort_executor import OrtExecutor, available_providers
from hetero.framework.executors.torch_executor import TorchExecutor
from hetero.framework.graph import ComputeGraph, GraphFormat

__all__ = ["GpuBackend", "device_index"]

logger = logging.getLogger(__name__)

TORCH = "torch"
ONNX = "onnx"
HOST_ONNX = "host-onnx"


def _onnx_source(graph: ComputeGraph) -> bytes | str:
    source = graph.source
    if isinstance(source, bytes):
        return source
    if isinstance(source, str | Path):
        return str(source)
    raise ValueError(f"graph {graph.name!r}: an ONNX source must be bytes or a path")


def device_index(device_id: str) -> int:
    """``N`` of ``cuda:N`` / ``rocm:N``."""
    return int(device_id.split(":", 1)[1])


class GpuBackend(Backend):
    """Execution on GPUs through the torch and ONNX Runtime executors.

    Subclasses set ``ort_provider`` (``CUDAExecutionProvider``, ``ROCMExecutionProvider``) and
    implement discovery, telemetry and :meth:`_device_memory_used`.
    """

    supports_graph_capture: ClassVar[bool] = True
    supports_peer_copy: ClassVar[bool] = True
    ort_provider: ClassVar[str]
    graph_formats: ClassVar[frozenset[GraphFormat]] = frozenset(
        {GraphFormat.TORCH, GraphFormat.ONNX}
    )

    def __init__(self) -> None:
        super().__init__()
        self._executors: dict[str, TorchExecutor] = {}
        self._sessions: dict[str, OrtExecutor] = {}
        self._executor_lock = threading.Lock()

    @abc.abstractmethod
    def _device_memory_used(self, device_id: str) -> int:
        """Bytes in use on the device now, from the vendor's management library."""

    def _executor(self, device_id: str) -> TorchExecutor:
        with self._executor_lock:
            if device_id not in self._executors:
                import torch

                index = device_index(device_id)
                self._executors[device_id] = TorchExecutor(
                    f"cuda:{index}", memory_in_use=lambda: int(torch.cuda.memory_reserved(index))
                )
            return self._executors[device_id]

    def _ort(self, device_id: str) -> OrtExecutor:
        with self._executor_lock:
            if device_id not in self._sessions:
                options = {"device_id": device_index(device_id)}
                self._sessions[device_id] = OrtExecutor(self.ort_provider, options)
            return self._sessions[device_id]

    def accepts(self, graph_format: GraphFormat, device_id: str) -> bool:
        if graph_format is GraphFormat.ONNX:
            return self.ort_provider in available_providers()
        return graph_format in self.graph_formats

    def _host_ort(self) -> OrtExecutor:
        with self._executor_lock:
            if "host" not in self._sessions:
                self._sessions["host"] = OrtExecutor("CPUExecutionProvider")
            return self._sessions["host"]

    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        if graph.helper and graph.format is GraphFormat.ONNX:  # runs on the host CPU
            return HOST_ONNX, _onnx_source(graph)
        if graph.format is GraphFormat.TORCH:
            assert callable(graph.source)
            return TORCH, self._executor(device_id).prepare(graph.source)
        if graph.format is GraphFormat.ONNX:
            if self.ort_provider not in available_providers():
                raise ValueError(
                    f"ONNX graphs need onnxruntime's {self.ort_provider}, which this "
                    "onnxruntime build lacks (install onnxruntime-gpu), or a torch graph"
                )
            return ONNX, _onnx_source(graph)
        raise ValueError(f"graph format {graph.format.value!r} is not supported by {self.name}")

    def _load(self, executable: Executable) -> tuple[Any, int]:
        kind, prepared = executable.native
        if kind == TORCH:
            module, size = self._executor(executable.device_id).load(prepared)
            return (TORCH, module, None), size
        if kind == HOST_ONNX:  # host memory: the device's memory is not touched
            return (ONNX, self._host_ort().session(prepared, threads=1), None), 0
        before = self._device_memory_used(executable.device_id)
        session = self._ort(executable.device_id).session(prepared)
        grown = max(0, self._device_memory_used(executable.device_id) - before)
        floor = len(prepared) if isinstance(prepared, bytes) else Path(prepared).stat().st_size
        return (ONNX, session, None), max(grown, floor)

    def _unload(self, model: LoadedModel) -> None:
        kind, runnable, _ = model.native
        if kind == TORCH:
            self._executor(model.device_id).unload(runnable)

    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        kind, runnable, captured = model.native
        if kind == TORCH:
            return self._executor(model.device_id).run(runnable, inputs, captured)
        return OrtExecutor.run(runnable, inputs)

    def _native(self, model: LoadedModel) -> Any:
        return model.native[1]

    def _torch_device(self, device_id: str) -> str:
        return f"cuda:{device_index(device_id)}"

    def _capture(self, model: LoadedModel, example_inputs: Arrays) -> LoadedModel:
        kind, runnable, _ = model.native
        if kind != TORCH:
            reason = "graph capture covers torch graphs; ONNX Runtime sessions run eagerly"
        else:
            captured, reason = self._executor(model.device_id).capture(runnable, example_inputs)
            if captured is not None:
                model.native = (kind, runnable, captured)
                model.captured = True
                return model
        logger.warning("%s: %s falls back to eager: %s", model.device_id, model.graph.name, reason)
        return model

    def _copy(self, array: np.ndarray[Any, Any], src: str, dst: str) -> Any:
        import torch

        src_index, dst_index = device_index(src), device_index(dst)
        peer_ok = src_index == dst_index or bool(
            torch.cuda.can_device_access_peer(src_index, dst_index)
        )
        return self._executor(src).copy(array, f"cuda:{dst_index}", peer_ok)
