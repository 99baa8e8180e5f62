"""ONNX Runtime: the execution providers that run on this host's CPU or an NPU.

GPU providers (CUDA, ROCm, TensorRT) belong to the cuda and rocm backends, and the Azure
provider is a remote endpoint, not a device, so neither is listed here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetero.backends.npu.runtime import Runtime, onnx_bytes_or_path
from hetero.framework.devices import DeviceClass
from hetero.framework.graph import ComputeGraph

PROVIDER_CLASSES = {
    "CPUExecutionProvider": DeviceClass.CPU,
    "CANNExecutionProvider": DeviceClass.NPU,  # Huawei Ascend
    "QNNExecutionProvider": DeviceClass.NPU,  # Qualcomm Hexagon
    "VitisAIExecutionProvider": DeviceClass.NPU,  # AMD Ryzen AI
    "OpenVINOExecutionProvider": DeviceClass.NPU,
}


class OnnxRuntime(Runtime):
    """ONNX Runtime ``InferenceSession`` pinned to one provider, refusing silent CPU fallback."""

    name = "onnxruntime"

    def __init__(self) -> None:
        import onnxruntime

        self._ort = onnxruntime

    def local_devices(self) -> list[tuple[str, DeviceClass, str, dict[str, Any]]]:
        found = []
        for provider in self._ort.get_available_providers():
            device_class = PROVIDER_CLASSES.get(provider)
            if device_class is None:
                continue
            props = {"runtime": "onnxruntime", "runtime_version": self._ort.__version__}
            found.append(
                (provider, device_class, provider.removesuffix("ExecutionProvider"), props)
            )
        return found

    def compile(self, graph: ComputeGraph, local_id: str) -> Any:
        # A session is the resident form, so compiling only resolves the source; a malformed
        # graph surfaces in load() as a CompileError.
        return onnx_bytes_or_path(graph)

    def load(self, prepared: Any, graph: ComputeGraph, local_id: str) -> Any:
        options = self._ort.SessionOptions()
        options.log_severity_level = 3
        if local_id != "CPUExecutionProvider":  # no silent CPU fallback for unsupported nodes
            options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        session = self._ort.InferenceSession(prepared, options, providers=[local_id])
        active = session.get_providers()
        if not active or active[0] != local_id:
            raise RuntimeError(f"provider {local_id} did not take the session (got {active})")
        return session

    def run(
        self, loaded: Any, inputs: dict[str, np.ndarray[Any, Any]]
    ) -> dict[str, np.ndarray[Any, Any]]:
        names = [output.name for output in loaded.get_outputs()]
        return {n: np.asarray(v) for n, v in zip(names, loaded.run(names, inputs), strict=True)}
