"""The node agent: what runs on every Ray node, inside one actor pinned to that node.

It discovers the node's devices through the registered backends (the same discovery a single
process does) and reports them; the models live in the lane actors
(:mod:`~hetero.framework.cluster.lane_actor`). It knows nothing of Ray: the cluster module
makes it an actor, so this file is importable (and testable) without the ``hetero[ray]`` extra.
"""

from __future__ import annotations

import threading

from hetero.framework.backend import Backend
from hetero.framework.devices import DeviceSpec, Telemetry
from hetero.framework.fleet import discover_devices
from hetero.framework.graph import GraphFormat
from hetero.framework.registry import Registry, default_registry

__all__ = ["NodeAgent"]


class NodeAgent:
    """Devices of one node, as its backends discover them."""

    def __init__(self, registry: Registry | None = None) -> None:
        self._registry = registry or default_registry()
        self._backends: dict[str, Backend] = {}
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

    def telemetry(self, device_id: str) -> Telemetry:
        """What this node's device ``device_id`` (its id on the node) is doing now, read by
        its own backend (NVML, amdsmi, psutil); raises what that backend raises."""
        return self._backend(device_id.split(":", 1)[0]).telemetry(device_id)

    def _backend(self, name: str) -> Backend:
        with self._lock:
            if name not in self._backends:
                self._backends[name] = self._registry.backend(name)
            return self._backends[name]
