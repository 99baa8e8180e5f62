"""CudaBackend: NVML for discovery, topology and telemetry; torch (or ONNX Runtime's CUDA
provider for ONNX graphs) for execution; CUDA Graph capture for static shapes."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hetero.backends.cuda import nvml_probe, translate
from hetero.backends.cuda.torch_executor import TorchExecutor
from hetero.framework.backend import Arrays, Backend, Executable, LoadedModel
from hetero.framework.devices import DeviceSpec, Telemetry
from hetero.framework.graph import ComputeGraph, GraphFormat

__all__ = ["CudaBackend"]

logger = logging.getLogger(__name__)

TORCH = "torch"
ONNX = "onnx"


class CudaBackend(Backend):
    """NVIDIA GPUs. ``nvml`` is the pynvml module; tests pass a named fake in its place."""

    name: ClassVar[str] = "cuda"
    visible_devices_env_var: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    supports_graph_capture: ClassVar[bool] = True
    supports_peer_copy: ClassVar[bool] = True
    ort_provider: ClassVar[str] = "CUDAExecutionProvider"
    graph_formats: ClassVar[frozenset[GraphFormat]] = frozenset(
        {GraphFormat.TORCH, GraphFormat.ONNX}
    )

    def __init__(self, nvml: Any = None) -> None:
        super().__init__()
        # NVML numbers GPUs in PCI bus order; make CUDA (and so torch) use the same order, so
        # device cuda:N is the same GPU for telemetry and execution.
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        self._nvml_ready = False
        self._executors: dict[str, TorchExecutor] = {}
        self._executor_lock = threading.Lock()

    # --- discovery and telemetry -------------------------------------------------------------

    def _ensure_nvml(self) -> None:
        if not self._nvml_ready:
            self._nvml.nvmlInit()
            self._nvml_ready = True

    def _discover(self) -> list[DeviceSpec]:
        self._ensure_nvml()
        return translate.device_specs(nvml_probe.read_host(self._nvml), backend=self.name)

    def _telemetry(self, device_id: str) -> Telemetry:
        self._ensure_nvml()
        reading = nvml_probe.read_gpu(self._nvml, _index(device_id))
        return translate.telemetry(reading, device_id, time.time())

    # --- execution ---------------------------------------------------------------------------

    def _executor(self, device_id: str) -> TorchExecutor:
        with self._executor_lock:
            if device_id not in self._executors:
                import torch

                index = _index(device_id)
                self._executors[device_id] = TorchExecutor(
                    f"cuda:{index}", memory_in_use=lambda: int(torch.cuda.memory_reserved(index))
                )
            return self._executors[device_id]

    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        if graph.format is GraphFormat.TORCH:
            assert callable(graph.source)
            return TORCH, self._executor(device_id).prepare(graph.source)
        if graph.format is GraphFormat.ONNX:
            import onnxruntime

            if self.ort_provider not in onnxruntime.get_available_providers():
                raise ValueError(
                    f"ONNX graphs need onnxruntime's {self.ort_provider}, which this "
                    "onnxruntime build lacks (install onnxruntime-gpu), or a torch graph"
                )
            source = graph.source
            if isinstance(source, str | Path):
                source = str(source)
            return ONNX, source
        raise ValueError(f"graph format {graph.format.value!r} is not supported by {self.name}")

    def _device_memory_used(self, device_id: str) -> int:
        return nvml_probe.read_gpu(self._nvml, _index(device_id)).memory_used_bytes

    def _load(self, executable: Executable) -> tuple[Any, int]:
        kind, prepared = executable.native
        if kind == TORCH:
            module, size = self._executor(executable.device_id).load(prepared)
            return (TORCH, module, None), size
        import onnxruntime

        before = self._device_memory_used(executable.device_id)
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        provider = (self.ort_provider, {"device_id": _index(executable.device_id)})
        session = onnxruntime.InferenceSession(prepared, options, providers=[provider])
        if session.get_providers()[0] != self.ort_provider:
            raise RuntimeError(f"{self.ort_provider} did not take the session")
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
        names = [output.name for output in runnable.get_outputs()]
        values = runnable.run(names, {n: np.ascontiguousarray(a) for n, a in inputs.items()})
        return {name: np.asarray(value) for name, value in zip(names, values, strict=True)}

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

        src_index, dst_index = _index(src), _index(dst)
        peer_ok = src_index == dst_index or bool(
            torch.cuda.can_device_access_peer(src_index, dst_index)
        )
        return self._executor(src).copy(array, f"cuda:{dst_index}", peer_ok)


def _index(device_id: str) -> int:
    return int(device_id.split(":", 1)[1])
