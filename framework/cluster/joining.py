"""Devices that join a running fleet (a node that joined, or came back under a new node id)
are warmed before the engine places anything on them.

A joining device's actor is started and given what the fleet's devices of its kind already
hold (their stages set up, their resident models loaded: :meth:`RayModelHost.warmth`) on a
thread of its own; the heartbeat hands the device to the engine only once that is done, so no
request waits for a cold start or a load there. A device of a kind no other device has yet
joins at once (there is nothing to warm it with; its first runs load what they need, as at
start-up). Warming that fails (a load past its timeout) is logged and the device joins cold.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from hetero.framework.cluster.remote_lanes import RayModelHost, Warmth
from hetero.framework.devices import DeviceSpec
from hetero.framework.graph import GraphFormat
from hetero.framework.stage_plugin import StagePlugin

__all__ = ["Joining", "kind_of"]

logger = logging.getLogger(__name__)


def kind_of(device: DeviceSpec) -> tuple[str, str, int]:
    """What makes two nodes' devices interchangeable for warming: the backend on the node,
    the device's local id without its index (``cuda:3`` and ``cuda:0`` are one kind) and its
    size as a device group (``vllm:cuda:0+1`` and ``vllm:cuda:2+3`` are one kind, not a
    single GPU's)."""
    local = str(device.properties.get("node_device", device.id))
    backend = str(device.properties.get("node_backend", device.backend))
    return backend, local.rstrip("0123456789+"), int(device.properties.get("device_group", 1))


class Joining:
    """Devices being warmed, and those warm and ready to join, for one backend."""

    def __init__(self, make_host: Callable[[DeviceSpec], RayModelHost]) -> None:
        self._make_host = make_host
        self._warming: dict[str, RayModelHost] = {}
        self._ready: list[DeviceSpec] = []
        self._warm_hosts: dict[str, RayModelHost] = {}  # warmed, for the engine to take
        self._lock = threading.Lock()

    def start(self, devices: Iterable[DeviceSpec], peers: Iterable[RayModelHost]) -> None:
        """Warm each of ``devices`` with what ``peers`` of its kind hold (in the background);
        one with nothing to warm with is ready at once."""
        by_kind: dict[tuple[str, str, int], list[RayModelHost]] = {}
        for peer in peers:
            by_kind.setdefault(kind_of(peer.device), []).append(peer)
        for device in devices:
            warmth = _union(host.warmth() for host in by_kind.get(kind_of(device), []))
            if not warmth[0]:
                with self._lock:
                    self._ready.append(device)
                continue
            host = self._make_host(device)
            with self._lock:
                self._warming[device.id] = host
            name = f"hetero-warm:{device.id}"
            thread = threading.Thread(
                target=self._warm, args=(host, warmth), name=name, daemon=True
            )
            thread.start()

    def _warm(self, host: RayModelHost, warmth: Warmth) -> None:
        began = time.monotonic()
        try:
            host.warm(warmth)
        except Exception as err:  # it joins cold: its first runs load what they need
            logger.warning("%s joins cold: warming it failed: %s", host.device.id, err)
        else:
            logger.info(
                "%s: warm in %.1f s (%d stages, %d models); it joins",
                host.device.id,
                time.monotonic() - began,
                len(warmth[0]),
                len(warmth[1]),
            )
        with self._lock:
            self._warming.pop(host.device.id, None)
            self._warm_hosts[host.device.id] = host
            self._ready.append(host.device)

    def ready(self) -> list[DeviceSpec]:
        """The devices warm since the last call (the heartbeat hands them to the engine)."""
        with self._lock:
            ready, self._ready = self._ready, []
            return ready

    def host(self, device_id: str) -> RayModelHost | None:
        """The warmed host of a device that joined (once: the engine takes it)."""
        with self._lock:
            return self._warm_hosts.pop(device_id, None)

    def close(self) -> None:
        """End the actors of devices warmed but never taken by the engine."""
        with self._lock:
            hosts = [*self._warming.values(), *self._warm_hosts.values()]
            self._warming.clear()
            self._warm_hosts.clear()
        for host in hosts:
            host.close()


def _union(warmths: Iterable[Warmth]) -> Warmth:
    plugins: dict[str, StagePlugin] = {}
    loads: dict[str, tuple[GraphFormat, int]] = {}
    for stage_plugins, model_loads in warmths:
        plugins.update(stage_plugins)
        loads.update(model_loads)
    return plugins, loads
