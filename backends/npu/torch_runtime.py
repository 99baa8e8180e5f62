"""torch on the host CPU, for stages whose graphs are torch modules (an LLM's KV-cache loop)."""

from __future__ import annotations

import threading
from importlib import metadata
from typing import Any, ClassVar

import numpy as np

from hetero.backends.npu.runtime import Runtime
from hetero.framework.devices import DeviceClass
from hetero.framework.executors.torch_executor import TorchExecutor
from hetero.framework.graph import ComputeGraph, GraphFormat

CPU = "cpu"


class TorchRuntime(Runtime):
    """One device, ``cpu``, through :class:`TorchExecutor`. torch (about 200 MB of memory) is
    imported at the first graph, not at discovery: a policy that never places a torch graph
    never pays for it."""

    name = "torch"
    formats: ClassVar[frozenset[GraphFormat]] = frozenset({GraphFormat.TORCH})

    def __init__(self) -> None:
        self.version = metadata.version("torch")  # raises when torch is not installed
        self._made: TorchExecutor | None = None
        self._lock = threading.Lock()

    @property
    def _executor(self) -> TorchExecutor:
        with self._lock:
            if self._made is None:
                self._made = TorchExecutor(CPU)
            return self._made

    def local_devices(self) -> list[tuple[str, DeviceClass, str, dict[str, Any]]]:
        props = {"runtime": "torch", "runtime_version": self.version}
        return [(CPU, DeviceClass.CPU, "torch CPU", props)]

    def compile(self, graph: ComputeGraph, local_id: str) -> Any:
        if graph.format is not GraphFormat.TORCH or not callable(graph.source):
            raise ValueError(f"graph format {graph.format.value!r} is not supported (torch only)")
        return graph.source

    def load(self, prepared: Any, graph: ComputeGraph, local_id: str) -> Any:
        self._executor.set_threads(graph.threads)
        module, _ = self._executor.load(self._executor.prepare(prepared))
        return module

    def run(
        self, loaded: Any, inputs: dict[str, np.ndarray[Any, Any]]
    ) -> dict[str, np.ndarray[Any, Any]]:
        return self._executor.run(loaded, inputs)

    def resident_bytes(self, loaded: Any) -> int:
        tensors = [*loaded.parameters(), *loaded.buffers()]
        return int(sum(t.numel() * t.element_size() for t in tensors))

    def unload(self, loaded: Any) -> None:
        self._executor.unload(loaded)
