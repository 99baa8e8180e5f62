"""The npu backend: the host's runtimes side by side, on host memory: OpenVINO (CPU, GPU,
NPU), ONNX Runtime (CPU and NPU execution providers) and torch on the CPU."""

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
from hetero.framework.graph import ComputeGraph, GraphFormat

__all__ = ["NpuBackend"]

logger = logging.getLogger(__name__)


def _make_runtime(name: str) -> Runtime:
    if name == "openvino":
        from hetero.backends.npu.openvino_runtime import OpenVinoRuntime

        return OpenVinoRuntime()
    if name == "onnxruntime":
        from hetero.backends.npu.onnxruntime_runtime import OnnxRuntime

        return OnnxRuntime()
    if name == "torch":
        from hetero.backends.npu.torch_runtime import TorchRuntime

        return TorchRuntime()
    raise ValueError(f"unknown npu runtime {name!r}")


class NpuBackend(Backend):
    """OpenVINO, ONNX Runtime and torch devices: the host CPU here, Intel/Ascend NPUs where
    present. Device ids name the runtime: ``npu:openvino/CPU``,
    ``npu:onnxruntime/CPUExecutionProvider``, ``npu:torch/cpu``.

    Memory accounting: a load is charged the larger of the serialized model size (or the
    graph's resident hint) and the process's resident-set growth while loading, and exactly
    that is returned on unload.
    """

    name: ClassVar[str] = "npu"
    graph_formats: ClassVar[frozenset[GraphFormat]] = frozenset(
        {GraphFormat.ONNX, GraphFormat.TORCH}
    )

    def __init__(self, runtimes: tuple[str, ...] = ("openvino", "onnxruntime", "torch")) -> None:
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

    def _runtime_for_graph(self, device_id: str, graph: ComputeGraph) -> tuple[Runtime, str]:
        """Where a graph of ``device_id``'s stage runs: on the device's own runtime when it
        takes the format (and the graph is not a host helper); otherwise on the host's runtime
        for the format (a torch decoder beside an ONNX encoder runs in torch on the CPU, a
        helper ONNX graph on ONNX Runtime's CPU provider)."""
        runtime, local_id = self._runtime_for(device_id)
        if graph.format in runtime.formats and not graph.helper:
            return runtime, local_id
        for other_name, other_local in (("torch", "cpu"), ("onnxruntime", "CPUExecutionProvider")):
            other = self._runtimes.get(other_name)
            if other is not None and graph.format in other.formats:
                return other, other_local
        raise ValueError(
            f"graph format {graph.format.value!r} is not supported on {device_id} "
            f"({', '.join(f.value for f in runtime.formats)})"
        )

    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        runtime, local_id = self._runtime_for_graph(device_id, graph)
        return runtime.compile(graph, local_id)

    def _load(self, executable: Executable) -> tuple[Any, int]:
        runtime, local_id = self._runtime_for_graph(executable.device_id, executable.graph)
        process = psutil.Process()
        with self._load_lock:  # one load at a time, so RSS growth belongs to this one
            before = process.memory_info().rss
            loaded = runtime.load(executable.native, executable.graph, local_id)
            grown = max(0, process.memory_info().rss - before)
        floor = max(executable.graph.hint.resident_bytes, runtime.resident_bytes(loaded))
        if executable.graph.format is GraphFormat.ONNX:
            floor = max(floor, serialized_size(onnx_bytes_or_path(executable.graph)))
        return (runtime, loaded), max(grown, floor)

    def _unload(self, model: LoadedModel) -> None:
        runtime: Runtime = model.native[0]
        runtime.unload(model.native[1])
        model.native = None  # the runtimes free the compiled model when the last reference goes

    def accepts(self, graph_format: GraphFormat, device_id: str) -> bool:
        try:
            runtime, _ = self._runtime_for(device_id)
        except UnknownDeviceError:
            return False
        return graph_format in runtime.formats

    def _native(self, model: LoadedModel) -> Any:
        runtime: Runtime = model.native[0]
        return runtime.native(model.native[1])

    def _torch_device(self, device_id: str) -> str | None:
        return "cpu" if "torch" in self._runtimes else None  # every npu device is the host

    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        runtime: Runtime = model.native[0]
        loaded = model.native[1]
        arrays = {name: np.asarray(value, order="C") for name, value in inputs.items()}
        return runtime.run(loaded, arrays)
