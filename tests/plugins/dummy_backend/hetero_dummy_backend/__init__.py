"""An out-of-tree hetero backend, installed for tests only.

It proves entry point discovery end to end (as vLLM's ``vllm_add_dummy_platform`` does) and is
the conformance suite's second subject. Its two "devices" are named as fakes: they execute ONNX
graphs with ``onnx.reference.ReferenceEvaluator`` (the ONNX reference implementation, pure
Python) in host memory, which is a real, independent executor for comparing against ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hetero.framework.backend import Arrays, Backend, Executable, LoadedModel
from hetero.framework.devices import DeviceClass, DeviceSpec, Link, LinkKind, Telemetry
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.registry import Detection

__all__ = ["DummyBackend", "detect"]

DEVICE_MEMORY = 1 << 30


class DummyBackend(Backend):
    """Two fake accelerators joined by a fake PCIe link, running the ONNX reference evaluator.

    Tests may set, before discovery, ``peak_flops`` (a figure that makes the cost model prefer
    these devices) and, at any time, ``failing`` (every run raises, as a device that fails
    mid-load does).
    """

    name: ClassVar[str] = "dummy"
    visible_devices_env_var: ClassVar[str | None] = "DUMMY_VISIBLE_DEVICES"
    peak_flops: ClassVar[float] = 1e9
    failing: ClassVar[bool] = False

    def _discover(self) -> list[DeviceSpec]:
        ids = ("dummy:0", "dummy:1")
        return [
            DeviceSpec(
                id=device_id,
                device_class=DeviceClass.NPU,
                vendor_name="Dummy Accelerator (fake, for tests)",
                backend=self.name,
                host="localhost",
                memory_bytes=DEVICE_MEMORY,
                peak_flops={"fp32": self.peak_flops},
                memory_bandwidth_bytes_per_s=self.peak_flops,
                links=tuple(
                    Link(peer=peer, kind=LinkKind.PCIE, bandwidth_bytes_per_s=1e9)
                    for peer in ids
                    if peer != device_id
                ),
                numa_node=0,
            )
            for device_id in ids
        ]

    def _telemetry(self, device_id: str) -> Telemetry:
        used = self.memory_accounted(device_id)
        return Telemetry(device_id=device_id, memory_used_bytes=used, utilisation=0.0)

    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        if graph.format is not GraphFormat.ONNX or not isinstance(graph.source, bytes | str | Path):
            raise ValueError("the dummy backend runs ONNX graphs (bytes or a file)")
        import onnx

        source = (
            graph.source if isinstance(graph.source, bytes) else Path(graph.source).read_bytes()
        )
        model = onnx.load_from_string(source)
        onnx.checker.check_model(model)
        return model

    def _load(self, executable: Executable) -> tuple[Any, int]:
        from onnx.reference import ReferenceEvaluator

        size = executable.native.ByteSize()
        if size + self.memory_accounted(executable.device_id) > DEVICE_MEMORY:
            raise MemoryError("dummy device is full")
        return ReferenceEvaluator(executable.native), size

    def _unload(self, model: LoadedModel) -> None:
        model.native = None

    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        if self.failing:
            raise RuntimeError("injected dummy device fault")
        evaluator = model.native
        expected = list(evaluator.input_names)
        missing = [name for name in expected if name not in inputs]
        if missing:
            raise ValueError(f"missing inputs: {missing}")
        outputs = evaluator.run(None, {name: inputs[name] for name in expected})
        return {
            name: np.asarray(value)
            for name, value in zip(evaluator.output_names, outputs, strict=True)
        }


def detect() -> Detection:
    """Always available: it needs nothing but numpy and onnx."""
    return Detection.found("dummy", DummyBackend, reason="fake devices for tests", priority=-10)
