"""The topology model: devices, the links between them, and what moving bytes costs.

Nodes are devices plus one node per host (its memory). Edges are the devices' own links
(NVLink, xGMI, PCIe peer, network), each device's path to its host's memory (PCIe for an
accelerator, the memory bus for a CPU device) and a network link between every pair of hosts.
:meth:`Topology.transfer_time` is the cheapest store-and-forward route for a given size: each
hop costs its latency plus bytes over its bandwidth, so small messages prefer few hops and large
ones prefer wide links. The scheduler uses it for pipeline affinity.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from hetero.framework.devices import DeviceClass, DeviceSpec, LinkKind
from hetero.framework.errors import UnknownDeviceError

__all__ = ["Hop", "Topology", "host_link"]

# PCIe Gen4 x16 carries 32 GB/s each way before protocol overhead; about 25 GB/s is what
# cudaMemcpy reaches from pinned memory (NVIDIA's bandwidthTest on A100 hosts).
DEFAULT_HOST_LINK_BANDWIDTH = 25e9
DEFAULT_HOST_LINK_LATENCY = 5e-6
# 200 Gb/s InfiniBand HDR per host: 25 GB/s; a few microseconds end to end.
DEFAULT_NETWORK_BANDWIDTH = 25e9
DEFAULT_NETWORK_LATENCY = 5e-6
HOST_PREFIX = "host:"


@dataclass(frozen=True, slots=True)
class Hop:
    """One edge of a route."""

    src: str
    dst: str
    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float

    def seconds(self, size: float) -> float:
        """Time to push ``size`` bytes across this hop."""
        return self.latency_s + size / self.bandwidth_bytes_per_s


class Topology:
    """Devices and links as a graph, with transfer-time estimates between any two devices."""

    def __init__(
        self,
        devices: Iterable[DeviceSpec],
        *,
        network_bandwidth_bytes_per_s: float = DEFAULT_NETWORK_BANDWIDTH,
        network_latency_s: float = DEFAULT_NETWORK_LATENCY,
    ) -> None:
        self._devices = {device.id: device for device in devices}
        self._edges: dict[str, dict[str, Hop]] = {}
        hosts = sorted({device.host for device in self._devices.values()})
        for device in self._devices.values():
            for link in device.links:
                if link.peer in self._devices:
                    self._add(
                        Hop(
                            device.id,
                            link.peer,
                            link.kind.value,
                            link.bandwidth_bytes_per_s,
                            link.latency_s,
                        )
                    )
            bandwidth, latency = host_link(device)
            host = HOST_PREFIX + device.host
            self._add(Hop(device.id, host, "host", bandwidth, latency))
            self._add(Hop(host, device.id, "host", bandwidth, latency))
        for a, b in itertools.permutations(hosts, 2):
            self._add(
                Hop(
                    HOST_PREFIX + a,
                    HOST_PREFIX + b,
                    LinkKind.NETWORK.value,
                    network_bandwidth_bytes_per_s,
                    network_latency_s,
                )
            )

    def _add(self, hop: Hop) -> None:
        edges = self._edges.setdefault(hop.src, {})
        current = edges.get(hop.dst)
        # Keep the wider of two parallel links (an NVLink beside a PCIe path to the same peer).
        if current is None or hop.bandwidth_bytes_per_s > current.bandwidth_bytes_per_s:
            edges[hop.dst] = hop

    @property
    def devices(self) -> tuple[DeviceSpec, ...]:
        """The devices in the model."""
        return tuple(self._devices.values())

    def _check(self, device_id: str) -> None:
        if device_id not in self._devices:
            raise UnknownDeviceError(device_id)

    def route(self, size: float, src: str, dst: str) -> tuple[Hop, ...]:
        """The cheapest route for ``size`` bytes from ``src`` to ``dst`` (empty when equal)."""
        self._check(src)
        self._check(dst)
        if src == dst:
            return ()
        best: dict[str, float] = {src: 0.0}
        came_by: dict[str, Hop] = {}
        frontier: list[tuple[float, str]] = [(0.0, src)]
        while frontier:
            cost, node = heapq.heappop(frontier)
            if node == dst:
                break
            if cost > best.get(node, float("inf")):
                continue
            for hop in self._edges.get(node, {}).values():
                # A route passes through a device only at its ends; in between, only hosts.
                if hop.dst != dst and not hop.dst.startswith(HOST_PREFIX):
                    continue
                candidate = cost + hop.seconds(size)
                if candidate < best.get(hop.dst, float("inf")):
                    best[hop.dst] = candidate
                    came_by[hop.dst] = hop
                    heapq.heappush(frontier, (candidate, hop.dst))
        hops: list[Hop] = []
        node = dst
        while node != src:
            hop = came_by[node]
            hops.append(hop)
            node = hop.src
        return tuple(reversed(hops))

    def transfer_time(self, size: float, src: str, dst: str) -> float:
        """Seconds to move ``size`` bytes from device ``src`` to device ``dst``."""
        return sum(hop.seconds(size) for hop in self.route(size, src, dst))


def host_link(device: DeviceSpec) -> tuple[float, float]:
    """Bandwidth (bytes/s, per direction) and latency between a device and its host's memory:
    the memory bus for a CPU device, else the device's stated host bandwidth (PCIe), else a
    PCIe Gen4 x16 default."""
    if device.device_class is DeviceClass.CPU:
        return device.memory_bandwidth_bytes_per_s, 0.0
    value = device.properties.get("host_bandwidth_bytes_per_s")
    if isinstance(value, int | float) and value > 0:
        return float(value), DEFAULT_HOST_LINK_LATENCY
    return DEFAULT_HOST_LINK_BANDWIDTH, DEFAULT_HOST_LINK_LATENCY
