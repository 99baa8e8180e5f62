"""An out-of-tree hetero backend, installed for tests only.

It proves entry point discovery end to end (as vLLM's ``vllm_add_dummy_platform`` does) and is
the conformance suite's second subject. Its two "devices" are named as fakes: they execute ONNX
graphs with ``onnx.reference.ReferenceEvaluator`` (the ONNX reference implementation, pure
Python) in host memory, which is a real, independent executor for comparing against ONNX Runtime.
A graph's native handle (:class:`DummyNative`) runs it one step at a time, for a loop a stage
drives itself; a test may make one of those steps raise a device fault (:class:`NativeFault`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hetero.framework.backend import Arrays, Backend, Executable, LoadedModel
from hetero.framework.devices import DeviceClass, DeviceSpec, Link, LinkKind, Telemetry
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.registry import Detection

__all__ = ["DummyBackend", "DummyNative", "NativeFault", "detect"]

DEVICE_MEMORY = 1 << 30


@dataclass(eq=False)
class NativeFault:
    """A fault injected into the dummy devices' native handles: the ``at_step``-th step run
    through any of them (counted over both devices) raises ``error``, once, as a device that
    fails mid-decode does. ``fired_on`` names the device it was raised on."""

    error: Exception
    at_step: int = 1
    steps: int = 0
    fired_on: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def step(self, device_id: str) -> None:
        """Count one step on ``device_id``; raise ``error`` if it is the chosen one."""
        with self._lock:
            self.steps += 1
            if self.steps != self.at_step:
                return
            self.fired_on.append(device_id)
        raise self.error


class DummyNative:
    """The native handle of a graph loaded on a dummy device: one :meth:`run` is one step of
    a loop the stage drives itself (a decoder's), on the reference evaluator."""

    def __init__(self, evaluator: Any, device_id: str) -> None:
        self.evaluator = evaluator
        self.device_id = device_id

    def run(self, feeds: Mapping[str, np.ndarray[Any, Any]]) -> list[np.ndarray[Any, Any]]:
        """The graph's outputs, in order, for ``feeds``.

        Raises:
            ValueError: A feed's shape is not the one the graph declares (as ONNX Runtime's
                ``InvalidArgument``: "Got invalid dimensions for input").
        """
        fault = DummyBackend.native_fault
        if fault is not None:
            fault.step(self.device_id)
        for name, kind in zip(self.evaluator.input_names, self.evaluator.input_types, strict=True):
            declared = [d.dim_value or None for d in kind.tensor_type.shape.dim]
            got = list(np.shape(feeds[name]))
            if len(got) != len(declared) or any(
                want is not None and want != have for want, have in zip(declared, got, strict=True)
            ):
                raise ValueError(f"invalid dimensions for input {name}: {got}, expected {declared}")
        return [np.asarray(value) for value in self.evaluator.run(None, dict(feeds))]


class DummyBackend(Backend):
    """Two fake accelerators joined by a fake PCIe link, running the ONNX reference evaluator.

    Tests may set, before discovery, ``peak_flops`` (a figure that makes the cost model prefer
    these devices) and, at any time, ``failing`` (every run raises, as a device that fails
    mid-load does) or ``native_fault`` (one step through a native handle raises).
    """

    name: ClassVar[str] = "dummy"
    visible_devices_env_var: ClassVar[str | None] = "DUMMY_VISIBLE_DEVICES"
    peak_flops: ClassVar[float] = 1e9
    failing: ClassVar[bool] = False
    native_fault: ClassVar[NativeFault | None] = None

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

    def _native(self, model: LoadedModel) -> DummyNative:
        return DummyNative(model.native, model.device_id)

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
