"""A stage's graphs loaded on one device through its backend: the runner a plugin runs with.

The engine's device lanes hold one :class:`LoadedGraphs` per resident stage variant and hand
it to :meth:`StagePlugin.run`; :func:`open_graphs` does the same for code that runs one model
by itself on a named device (a model's own tests, a baseline in a benchmark).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hetero.framework.backend import Backend, LoadedModel
from hetero.framework.graph import ComputeGraph
from hetero.framework.registry import Registry, default_registry
from hetero.framework.stage_plugin import Arrays

__all__ = ["LoadedGraphs", "open_graphs"]


class LoadedGraphs:
    """Named graphs resident on one device (loaded all or none), runnable by name."""

    def __init__(self, backend: Backend, device_id: str, graphs: Mapping[str, ComputeGraph]):
        self.backend = backend
        self._device_id = device_id
        self.models: dict[str, LoadedModel] = {}
        try:
            for name, graph in graphs.items():
                self.models[name] = backend.load(backend.compile(graph, device_id))
        except BaseException:
            self.unload()
            raise

    @property
    def device_id(self) -> str:
        """Where the graphs live."""
        return self._device_id

    @property
    def torch_device(self) -> str | None:
        """The torch device string of :attr:`device_id` (None where torch does not run)."""
        return self.backend.torch_device(self._device_id)

    @property
    def memory_bytes(self) -> int:
        """Device memory the graphs hold, as the backend accounted it."""
        return sum(model.memory_bytes for model in self.models.values())

    def _model(self, graph: str) -> LoadedModel:
        try:
            return self.models[graph]
        except KeyError:
            known = ", ".join(sorted(self.models)) or "none"
            raise KeyError(f"no graph {graph!r} loaded on {self._device_id} ({known})") from None

    def run(self, graph: str, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        """Run one graph; its measured latency is recorded on the loaded model."""
        return self.backend.run(self._model(graph), inputs).outputs

    def native(self, graph: str) -> Any:
        """The runtime's own object for one graph (torch module, ORT session, ...)."""
        return self.backend.native(self._model(graph))

    def unload(self) -> None:
        """Release every graph (unloading twice is a no-op)."""
        models, self.models = self.models, {}
        for model in models.values():
            self.backend.unload(model)


def open_graphs(
    graphs: Mapping[str, ComputeGraph], device_id: str, registry: Registry | None = None
) -> LoadedGraphs:
    """Load ``graphs`` on ``device_id`` (``npu:onnxruntime/CPUExecutionProvider``, ...)
    through its backend from the registry."""
    backend = (registry or default_registry()).backend(device_id.split(":", 1)[0])
    backend.device(device_id)
    return LoadedGraphs(backend, device_id, graphs)
