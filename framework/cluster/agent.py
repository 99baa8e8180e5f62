"""The node agent: what runs on every Ray node, inside one actor pinned to that node.

It discovers the node's devices through the registered backends (the same discovery a single
process does), holds the graphs the engine made resident there, and runs them. It knows nothing
of Ray: the cluster module makes it an actor, so this file is importable (and testable) without
the ``hetero[ray]`` extra.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from hetero.framework.backend import Backend, LoadedModel, RunResult
from hetero.framework.devices import DeviceSpec
from hetero.framework.fleet import discover_devices
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.registry import Registry, default_registry

__all__ = ["NodeAgent"]

Arrays = dict[str, Any]


class NodeAgent:
    """Devices of one node, and the models resident on them, by handle."""

    def __init__(self, registry: Registry | None = None) -> None:
        self._registry = registry or default_registry()
        self._backends: dict[str, Backend] = {}
        self._models: dict[str, tuple[Backend, LoadedModel]] = {}
        self._handles = itertools.count(1)
        self._lock = threading.Lock()

    def devices(self) -> list[tuple[DeviceSpec, frozenset[GraphFormat]]]:
        """Every device of every available hardware backend on this node, with the graph
        formats its backend takes there."""
        found, _ = discover_devices(self._registry)
        out = []
        for device in found:
            backend = self._backend(device.backend)
            formats = frozenset(f for f in GraphFormat if backend.accepts(f, device.id))
            out.append((device, formats))
        return out

    def _backend(self, name: str) -> Backend:
        with self._lock:
            if name not in self._backends:
                self._backends[name] = self._registry.backend(name)
            return self._backends[name]

    def load(self, graph: ComputeGraph, device_id: str) -> tuple[str, int]:
        """Compile and load ``graph`` on this node's ``device_id``: (handle, bytes held)."""
        backend = self._backend(device_id.split(":", 1)[0])
        model = backend.load(backend.compile(graph, device_id))
        handle = f"m{next(self._handles)}"
        with self._lock:
            self._models[handle] = (backend, model)
        return handle, model.memory_bytes

    def run(self, handle: str, inputs: Arrays) -> RunResult:
        """Run a resident model; its outputs go back through the object store."""
        with self._lock:
            backend, model = self._models[handle]
        return backend.run(model, inputs)

    def unload(self, handle: str) -> None:
        """Release a resident model (unknown handles are ignored: unloading twice is fine)."""
        with self._lock:
            found = self._models.pop(handle, None)
        if found is not None:
            found[0].unload(found[1])

    def resident(self) -> int:
        """How many models are resident here."""
        with self._lock:
            return len(self._models)
