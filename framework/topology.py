"""The topology model: devices, the links between them, and what moving bytes costs.

Nodes are devices plus one node per host (its memory). Edges are the devices' own links
(NVLink, xGMI, PCIe peer, network), each device's path to its host's memory (PCIe for an
accelerator, the memory bus for a CPU device) and a network link between every pair of hosts.
:meth:`Topology.transfer_time` is the cheapest store-and-forward route for a given size: each
hop costs its latency plus bytes over its bandwidth, so small messages prefer few hops and large
ones prefer wide links. The scheduler uses it for pipeline affinity.
"""

from __future__ import annotations

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
        # Every pair of hosts is joined by the same network link: kept as its figures, not as
        # hosts x hosts edges (a 10,000-device fleet has 1,250 hosts, 1.6 million pairs).
        self._hosts = frozenset(hosts)
        self._network = (network_bandwidth_bytes_per_s, network_latency_s)

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

    def device(self, device_id: str) -> DeviceSpec:
        """The device ``device_id`` (:class:`UnknownDeviceError` if it is not in the model)."""
        self._check(device_id)
        return self._devices[device_id]

    def _check(self, device_id: str) -> None:
        if device_id not in self._devices:
            raise UnknownDeviceError(device_id)

    def host_hop(self, device_id: str) -> Hop:
        """The link from a device to its host's memory (the same figures both ways)."""
        self._check(device_id)
        return self._edges[device_id][HOST_PREFIX + self._devices[device_id].host]

    @property
    def hosts(self) -> frozenset[str]:
        """The hosts the devices sit in."""
        return self._hosts

    def network_hop(self, src_host: str, dst_host: str) -> Hop:
        """The network link from host ``src_host`` to host ``dst_host`` (two different hosts)."""
        if src_host == dst_host or not {src_host, dst_host} <= self._hosts:
            raise KeyError(f"no network hop from host {src_host!r} to host {dst_host!r}")
        bandwidth, latency = self._network
        return Hop(
            HOST_PREFIX + src_host,
            HOST_PREFIX + dst_host,
            LinkKind.NETWORK.value,
            bandwidth,
            latency,
        )

    def direct_peers(self, device_id: str) -> tuple[Hop, ...]:
        """The device's own links to other devices of the model (NVLink, xGMI, PCIe peer)."""
        self._check(device_id)
        return tuple(
            hop for hop in self._edges[device_id].values() if not hop.dst.startswith(HOST_PREFIX)
        )

    def route(self, size: float, src: str, dst: str) -> tuple[Hop, ...]:
        """The cheapest route for ``size`` bytes from ``src`` to ``dst`` (empty when equal).

        A route passes through a device only at its ends, so it is either the devices' own
        link or "inside a host, then host to host": ``src`` up to its host, the network hop
        when the hosts differ, down to ``dst``. Hosts are a complete graph of identical
        network links, so a detour through a third host (two latencies, two store-and-forward
        copies of the same bytes) never beats the direct hop. This is what a shortest-path
        search over the whole graph finds, in constant time (the via-host route wins only
        when strictly cheaper, as the search breaks ties).
        """
        self._check(src)
        self._check(dst)
        if src == dst:
            return ()
        up = self.host_hop(src)
        down = self._edges[HOST_PREFIX + self._devices[dst].host][dst]
        src_host, dst_host = self._devices[src].host, self._devices[dst].host
        if src_host == dst_host:
            via: tuple[Hop, ...] = (up, down)
        else:
            via = (up, self.network_hop(src_host, dst_host), down)
        direct = self._edges[src].get(dst)
        if direct is None:
            return via
        via_cost = 0.0
        for hop in via:  # summed hop by hop, as the search accumulates it
            via_cost += hop.seconds(size)
        return via if via_cost < 0.0 + direct.seconds(size) else (direct,)

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
