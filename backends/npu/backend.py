"""The npu backend: devices of OpenVINO and ONNX Runtime side by side, on host memory."""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar

import numpy as np
import psutil

from hetero.backends.npu.host_facts import host_facts
from hetero.backends.npu.runtime import Runtime, onnx_bytes_or_path, serialized_size
from hetero.framework.backend import Arrays, Backend, Executable, LoadedModel
from hetero.framework.devices import DeviceClass, DeviceSpec, Telemetry
from hetero.framework.errors import UnknownDeviceError
from hetero.framework.graph import ComputeGraph

__all__ = ["NpuBackend"]

logger = logging.getLogger(__name__)


def _make_runtime(name: str) -> Runtime:
    if name == "openvino":
        from hetero.backends.npu.openvino_runtime import OpenVinoRuntime

        return OpenVinoRuntime()
    if name == "onnxruntime":
        from hetero.backends.npu.onnxruntime_runtime import OnnxRuntime

        return OnnxRuntime()
    raise ValueError(f"unknown npu runtime {name!r}")


class NpuBackend(Backend):
    """OpenVINO and ONNX Runtime devices: the host CPU here, Intel/Ascend NPUs where present.

    Memory accounting: a load is charged the larger of the serialized model size and the
    process's resident-set growth while loading, and exactly that is returned on unload.
    """

    name: ClassVar[str] = "npu"

    def __init__(self, runtimes: tuple[str, ...] = ("openvino", "onnxruntime")) -> None:
        super().__init__()
        self._runtime_names = runtimes
        self._runtimes: dict[str, Runtime] = {}
        self._load_lock = threading.Lock()

    def _runtime_for(self, device_id: str) -> tuple[Runtime, str]:
        local = device_id.split(":", 1)[1]
        runtime_name, _, local_id = local.partition("/")
        runtime = self._runtimes.get(runtime_name)
        if runtime is None:
            raise UnknownDeviceError(device_id)
        return runtime, local_id

    def _discover(self) -> list[DeviceSpec]:
        facts = host_facts()
        specs: list[DeviceSpec] = []
        for runtime_name in self._runtime_names:
            try:
                runtime = _make_runtime(runtime_name)
                devices = runtime.local_devices()
            except Exception as err:  # a broken runtime must not hide the other one
                logger.warning("npu: %s unusable: %s: %s", runtime_name, type(err).__name__, err)
                continue
            self._runtimes[runtime_name] = runtime
            for local_id, device_class, vendor_name, runtime_props in devices:
                props = {
                    **runtime_props,
                    "physical_cores": facts.physical_cores,
                    "logical_cores": facts.logical_cores,
                    "clock_ghz": round(facts.clock_ghz, 3),
                    "shares_host_memory": True,
                }
                specs.append(
                    DeviceSpec(
                        id=f"{self.name}:{runtime_name}/{local_id}",
                        device_class=device_class,
                        vendor_name=vendor_name,
                        backend=self.name,
                        host=facts.hostname,
                        memory_bytes=facts.memory_bytes,
                        peak_flops=facts.peak_flops
                        if device_class is DeviceClass.CPU
                        else {"fp32": facts.peak_flops["fp32"]},
                        memory_bandwidth_bytes_per_s=facts.memory_bandwidth_bytes_per_s,
                        numa_node=0,
                        properties=props,
                    )
                )
        return specs

    def _telemetry(self, device_id: str) -> Telemetry:
        memory = psutil.virtual_memory()
        return Telemetry(
            device_id=device_id,
            memory_used_bytes=int(memory.total - memory.available),
            utilisation=min(1.0, psutil.cpu_percent(interval=None) / 100.0),
            power_watts=None,
        )

    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        runtime, local_id = self._runtime_for(device_id)
        return runtime.compile(graph, local_id)

    def _load(self, executable: Executable) -> tuple[Any, int]:
        runtime, local_id = self._runtime_for(executable.device_id)
        process = psutil.Process()
        with self._load_lock:  # one load at a time, so RSS growth belongs to this one
            before = process.memory_info().rss
            loaded = runtime.load(executable.native, executable.graph, local_id)
            grown = max(0, process.memory_info().rss - before)
        floor = max(
            executable.graph.hint.resident_bytes,
            serialized_size(onnx_bytes_or_path(executable.graph)),
        )
        return (runtime, loaded), max(grown, floor)

    def _unload(self, model: LoadedModel) -> None:
        model.native = None  # the runtimes free the compiled model when the last reference goes

    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        runtime: Runtime = model.native[0]
        loaded = model.native[1]
        arrays = {name: np.ascontiguousarray(value) for name, value in inputs.items()}
        return runtime.run(loaded, arrays)
