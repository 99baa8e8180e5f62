"""ONNX Runtime: the execution providers that run on this host's CPU or an NPU.

GPU providers (CUDA, ROCm, TensorRT) belong to the cuda and rocm backends, and the Azure
provider is a remote endpoint, not a device, so neither is listed here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetero.backends.npu.runtime import Runtime, onnx_bytes_or_path
from hetero.framework.devices import DeviceClass
from hetero.framework.executors.ort_executor import OrtExecutor, available_providers
from hetero.framework.graph import ComputeGraph

PROVIDER_CLASSES = {
    "CPUExecutionProvider": DeviceClass.CPU,
    "CANNExecutionProvider": DeviceClass.NPU,  # Huawei Ascend
    "QNNExecutionProvider": DeviceClass.NPU,  # Qualcomm Hexagon
    "VitisAIExecutionProvider": DeviceClass.NPU,  # AMD Ryzen AI
    "OpenVINOExecutionProvider": DeviceClass.NPU,
}


class OnnxRuntime(Runtime):
    """One :class:`OrtExecutor` per provider, refusing silent CPU fallback."""

    name = "onnxruntime"

    def __init__(self) -> None:
        self._executors = {
            provider: OrtExecutor(provider)
            for provider in available_providers()
            if provider in PROVIDER_CLASSES
        }

    def local_devices(self) -> list[tuple[str, DeviceClass, str, dict[str, Any]]]:
        return [
            (
                provider,
                PROVIDER_CLASSES[provider],
                provider.removesuffix("ExecutionProvider"),
                # a session's intra-op threads are its own (engine.thread_budget)
                {
                    "runtime": "onnxruntime",
                    "runtime_version": executor.version,
                    "threads_per_graph": True,
                },
            )
            for provider, executor in self._executors.items()
        ]

    def compile(self, graph: ComputeGraph, local_id: str) -> Any:
        # A session is the resident form, so compiling only resolves the source; a malformed
        # graph surfaces in load() as a CompileError.
        return onnx_bytes_or_path(graph)

    def load(self, prepared: Any, graph: ComputeGraph, local_id: str) -> Any:
        return self._executors[local_id].session(prepared, threads=graph.threads)

    def run(
        self, loaded: Any, inputs: dict[str, np.ndarray[Any, Any]]
    ) -> dict[str, np.ndarray[Any, Any]]:
        return OrtExecutor.run(loaded, inputs)
