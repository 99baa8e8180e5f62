"""CudaBackend: NVML for discovery, topology and telemetry; execution through the shared torch
and ONNX Runtime (CUDA provider) executors, with CUDA Graph capture for static shapes."""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

from hetero.backends.cuda import nvml_probe, translate
from hetero.framework.devices import DeviceSpec, Telemetry
from hetero.framework.gpu_backend import GpuBackend, device_index

__all__ = ["CudaBackend"]


class CudaBackend(GpuBackend):
    """NVIDIA GPUs. ``nvml`` is the pynvml module; tests pass a named fake in its place."""

    name: ClassVar[str] = "cuda"
    visible_devices_env_var: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    ort_provider: ClassVar[str] = "CUDAExecutionProvider"

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

    def _ensure_nvml(self) -> None:
        if not self._nvml_ready:
            self._nvml.nvmlInit()
            self._nvml_ready = True

    def _discover(self) -> list[DeviceSpec]:
        self._ensure_nvml()
        return translate.device_specs(nvml_probe.read_host(self._nvml), backend=self.name)

    def _telemetry(self, device_id: str) -> Telemetry:
        self._ensure_nvml()
        reading = nvml_probe.read_gpu(self._nvml, device_index(device_id))
        return translate.telemetry(reading, device_id, time.time())

    def _device_memory_used(self, device_id: str) -> int:
        return nvml_probe.read_gpu(self._nvml, device_index(device_id)).memory_used_bytes
