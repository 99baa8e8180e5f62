"""OpenVINO: every device ``Core().available_devices`` reports (CPU here; GPU, NPU elsewhere)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from hetero.backends.npu.runtime import Runtime, onnx_bytes_or_path
from hetero.framework.devices import DeviceClass
from hetero.framework.envs import model_cache
from hetero.framework.executors.openvino_executor import OpenVinoExecutor, OpenVinoModel
from hetero.framework.graph import ComputeGraph

logger = logging.getLogger(__name__)


def _device_class(name: str) -> DeviceClass:
    return DeviceClass.CPU if name.split(".", maxsplit=1)[0] == "CPU" else DeviceClass.NPU


class OpenVinoRuntime(Runtime):
    """OpenVINO through :class:`OpenVinoExecutor`: reads ONNX, compiles per device (f32 on
    the CPU unless the graph's dtype asks for less)."""

    name = "openvino"

    def __init__(self) -> None:
        self._executor = OpenVinoExecutor(cache_dir=model_cache() / "openvino")

    def local_devices(self) -> list[tuple[str, DeviceClass, str, dict[str, Any]]]:
        core = self._executor.core
        found = []
        for device in core.available_devices:
            try:
                vendor_name = str(core.get_property(device, "FULL_DEVICE_NAME"))
                caps = core.get_property(device, "OPTIMIZATION_CAPABILITIES")
            except RuntimeError as err:  # a plugin listed but not loadable (no OpenCL, no driver)
                logger.debug("openvino: skipping %s: %s", device, err)
                continue
            props = {
                "runtime": "openvino",
                "runtime_version": self._executor.version,
                "optimization_capabilities": [str(c) for c in caps],
                "threads_per_graph": True,  # a compiled model's threads (engine.thread_budget)
            }
            found.append((device, _device_class(device), vendor_name, props))
        return found

    def compile(self, graph: ComputeGraph, local_id: str) -> Any:
        return self._executor.read(onnx_bytes_or_path(graph))

    def load(self, prepared: Any, graph: ComputeGraph, local_id: str) -> Any:
        return self._executor.compile(
            prepared, local_id, dtype=graph.hint.dtype, threads=graph.threads
        )

    def run(
        self, loaded: Any, inputs: dict[str, np.ndarray[Any, Any]]
    ) -> dict[str, np.ndarray[Any, Any]]:
        model: OpenVinoModel = loaded
        return model.run(inputs)
