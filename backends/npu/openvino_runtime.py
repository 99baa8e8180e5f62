"""OpenVINO: every device ``Core().available_devices`` reports (CPU here; GPU, NPU elsewhere)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from hetero.backends.npu.runtime import Runtime, onnx_bytes_or_path
from hetero.framework.devices import DeviceClass
from hetero.framework.graph import ComputeGraph

logger = logging.getLogger(__name__)

# f32 unless the graph asks for reduced precision: OpenVINO defaults to bf16 on CPUs with
# AVX512-BF16, which changes numbers (and even Piper's output length).
_PRECISION_BY_DTYPE = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}


def _device_class(name: str) -> DeviceClass:
    return DeviceClass.CPU if name.split(".", maxsplit=1)[0] == "CPU" else DeviceClass.NPU


class OpenVinoRuntime(Runtime):
    """OpenVINO ``Core``: reads ONNX directly, compiles per device with a precision hint."""

    name = "openvino"

    def __init__(self) -> None:
        import openvino

        self._ov = openvino
        self._core = openvino.Core()

    def local_devices(self) -> list[tuple[str, DeviceClass, str, dict[str, Any]]]:
        found = []
        for device in self._core.available_devices:
            try:
                vendor_name = str(self._core.get_property(device, "FULL_DEVICE_NAME"))
                caps = self._core.get_property(device, "OPTIMIZATION_CAPABILITIES")
            except RuntimeError as err:  # a plugin listed but not loadable (no OpenCL, no driver)
                logger.debug("openvino: skipping %s: %s", device, err)
                continue
            props = {
                "runtime": "openvino",
                "runtime_version": self._ov.__version__,
                "optimization_capabilities": [str(c) for c in caps],
            }
            found.append((device, _device_class(device), vendor_name, props))
        return found

    def compile(self, graph: ComputeGraph, local_id: str) -> Any:
        return self._core.read_model(onnx_bytes_or_path(graph))

    def load(self, prepared: Any, graph: ComputeGraph, local_id: str) -> Any:
        config = {"INFERENCE_PRECISION_HINT": _PRECISION_BY_DTYPE.get(graph.hint.dtype, "f32")}
        if local_id.split(".", maxsplit=1)[0] != "CPU":
            config = {}
        compiled = self._core.compile_model(prepared, local_id, config)
        return compiled.create_infer_request()

    def run(
        self, loaded: Any, inputs: dict[str, np.ndarray[Any, Any]]
    ) -> dict[str, np.ndarray[Any, Any]]:
        # An infer request keeps its last input tensors: a missing input would silently reuse
        # the previous request's data, so names are checked here.
        expected = {port.get_any_name() for port in loaded.model_inputs}
        missing = sorted(expected - inputs.keys())
        unknown = sorted(inputs.keys() - expected)
        if missing or unknown:
            raise ValueError(f"inputs do not match the graph: missing {missing}, unknown {unknown}")
        results = loaded.infer(inputs)
        return {port.get_any_name(): np.array(value) for port, value in results.items()}
