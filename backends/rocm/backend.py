"""RocmBackend: amdsmi for discovery, topology and telemetry; execution through the shared
torch executor (a ROCm build of torch: HIP devices appear as ``cuda:N``) and ONNX Runtime's ROCm
provider; HIP Graph capture through torch's CUDA Graph API."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from hetero.backends.rocm import amdsmi_probe, translate
from hetero.framework.devices import DeviceSpec, Telemetry
from hetero.framework.gpu_backend import GpuBackend, device_index

__all__ = ["RocmBackend"]


class RocmBackend(GpuBackend):
    """AMD GPUs. ``amdsmi`` is the amdsmi module; tests pass a named fake in its place."""

    name: ClassVar[str] = "rocm"
    visible_devices_env_var: ClassVar[str | None] = "HIP_VISIBLE_DEVICES"
    ort_provider: ClassVar[str] = "ROCMExecutionProvider"

    def __init__(self, amdsmi: Any = None) -> None:
        if amdsmi is None:
            amdsmi = amdsmi_probe.import_amdsmi()
        super().__init__()
        self._amdsmi = amdsmi
        self._amdsmi_ready = False
        self._handles: list[Any] = []

    def _ensure_amdsmi(self) -> None:
        if not self._amdsmi_ready:
            self._amdsmi.amdsmi_init()
            self._handles = list(self._amdsmi.amdsmi_get_processor_handles())
            self._amdsmi_ready = True

    def _discover(self) -> list[DeviceSpec]:
        self._ensure_amdsmi()
        return translate.device_specs(amdsmi_probe.read_host(self._amdsmi), backend=self.name)

    def _telemetry(self, device_id: str) -> Telemetry:
        self._ensure_amdsmi()
        index = device_index(device_id)
        reading = amdsmi_probe.read_gpu(self._amdsmi, self._handles, index)
        return translate.telemetry(reading, device_id, time.time())

    def _device_memory_used(self, device_id: str) -> int:
        self._ensure_amdsmi()
        index = device_index(device_id)
        return amdsmi_probe.read_gpu(self._amdsmi, self._handles, index).vram_used_bytes
