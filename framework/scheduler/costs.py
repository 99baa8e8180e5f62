"""Static cost tables, computed once per fleet so a placement decision is a few vector ops.

For every (stage, variant) and device: whether the device may run it (class allowed, variant
runnable, model fits), the roofline time of the k-th item added to a forming batch, the load time
(resident bytes over the host link plus a fixed init), and, for every pair of devices, the
latency and inverse bandwidth of the cheapest route (so a transfer of n bytes costs
``latency + n * inverse_bandwidth``).

Routes are kept factored, as the topology model builds them: each device's link to its host,
the network hop between two hosts, and the few device-to-device links that beat going through
the host. A row of routes from one device is assembled on demand in O(devices), so the fleet
costs O(devices + links) memory and builds in time linear in the fleet, not one shortest-path
search per ordered pair into dense n x n tables (a 1,000-device fleet held a million of each).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hetero.framework.devices import DeviceSpec
from hetero.framework.graph import BandwidthHint
from hetero.framework.topology import Topology, host_link

__all__ = ["FleetCosts", "StageCosts"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# Fixed cost of bringing a model up besides moving its bytes (allocator, graph build): a model.
LOAD_INIT_S = 0.05
# Transfers are routed once for this size; the route's cost is then affine in the size.
ROUTE_PROBE_BYTES = 1 << 20
# Bytes of route rows kept, most recently used first: a row is two floats per device (16 bytes
# a device), so every source's row fits in fleets of up to 1,448 devices (16 MiB at 1,000, where
# a row takes about 10 us to assemble and a decision 20 us), and the cache stays at this bound
# however large the fleet (209 rows at 10,000 devices). When every source's row fits, all are
# built with the tables, so no decision assembles one.
ROUTE_ROWS_BYTES = 32 << 20
ROUTE_ROWS_LEAST = 16  # rows kept whatever the fleet's size


@dataclass(frozen=True, slots=True)
class StageCosts:
    """Per-device tables of one (stage, variant)."""

    key: str
    stage: str
    variant: str
    hint: BandwidthHint
    runnable: BoolArray
    marginal_s: FloatArray  # [devices, max_batch]: time the k-th item adds to a forming batch
    load_s: FloatArray
    min_residency_s: float
    why_not: tuple[str, ...]  # per device: "" or the static reason it cannot run this
    batch_s: tuple[tuple[float, ...], ...] = ()  # per device: the roofline of a batch of k


class FleetCosts:
    """Devices, their host links and pairwise routes, and every stage's tables."""

    def __init__(
        self, devices: Sequence[DeviceSpec], topology: Topology, capacity: Sequence[int]
    ) -> None:
        self.devices = tuple(devices)
        self.index = {device.id: i for i, device in enumerate(self.devices)}
        self.capacity = np.asarray(capacity, dtype=np.int64)
        self._host_of = np.zeros(len(self.devices), dtype=np.int64)
        hosts: dict[str, int] = {}
        for i, device in enumerate(self.devices):
            self._host_of[i] = hosts.setdefault(device.host, len(hosts))
        # The devices of each host, for the rows' inside-a-host entries.
        order = np.argsort(self._host_of, kind="stable")
        bounds = np.searchsorted(self._host_of[order], np.arange(len(hosts) + 1))
        self._members = [order[bounds[h] : bounds[h + 1]] for h in range(len(hosts))]
        # The same as a [hosts, widest host] matrix for the bounded search: a host narrower
        # than the widest repeats its own devices (a repeat changes no minimum).
        widest = max((len(m) for m in self._members), default=0)
        self.host_members = np.array(
            [np.resize(m, widest) for m in self._members], dtype=np.int64
        ).reshape(len(self._members), widest)
        # A device's host link carries the same figures up and down.
        up = [topology.host_hop(d.id) for d in self.devices]
        self._host_latency = np.array([hop.latency_s for hop in up])
        self._host_inverse_bandwidth = np.array([1 / hop.bandwidth_bytes_per_s for hop in up])
        self._network_latency = 0.0
        self._network_inverse_bandwidth = 0.0
        if len(hosts) > 1:
            first, second = list(hosts)[:2]
            network = topology.network_hop(first, second)  # every host pair has the same link
            self._network_latency = network.latency_s
            self._network_inverse_bandwidth = 1 / network.bandwidth_bytes_per_s
        # Device-to-device links where the link beats the route through the hosts.
        self._direct: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for i, src in enumerate(self.devices):
            targets, latency, inverse = [], [], []
            for peer in topology.direct_peers(src.id):
                hops = topology.route(ROUTE_PROBE_BYTES, src.id, peer.dst)
                if len(hops) == 1:
                    targets.append(self.index[peer.dst])
                    latency.append(0.0 + hops[0].latency_s)
                    inverse.append(0.0 + 1 / hops[0].bandwidth_bytes_per_s)
            if targets:
                order = np.argsort(targets, kind="stable")  # sorted, for routes_to's lookup
                self._direct[i] = (
                    np.asarray(targets, dtype=np.int64)[order],
                    np.asarray(latency)[order],
                    np.asarray(inverse)[order],
                )
        self.ingress_inverse_bandwidth = np.array([1 / host_link(d)[0] for d in self.devices])
        self._rows: OrderedDict[int, tuple[FloatArray, FloatArray]] = OrderedDict()
        self.rows_kept = max(ROUTE_ROWS_LEAST, ROUTE_ROWS_BYTES // (16 * max(1, len(self.devices))))
        # The least of every device's figures: floors of any route's last hop.
        empty = not len(self.devices)
        self._latency_least = 0.0 if empty else float(self._host_latency.min())
        self._inverse_least = 0.0 if empty else float(self._host_inverse_bandwidth.min())
        self.ingress_least = 0.0 if empty else float(self.ingress_inverse_bandwidth.min())
        self._host_list: list[int] = self._host_of.tolist()
        # Per device, the hosts a route from it reaches other than over the network: its own
        # and those it has a direct link into.
        self._near = [frozenset([self._host_list[i]]) for i in range(len(self.devices))]
        for i, (targets_of_i, _, _) in self._direct.items():
            self._near[i] = self._near[i] | frozenset(self._host_of[targets_of_i].tolist())
        if len(self.devices) <= self.rows_kept:
            for source in range(len(self.devices)):
                self.routes_from(source)

    @property
    def host_of(self) -> npt.NDArray[np.int64]:
        """Each device's host number (rows of :attr:`host_members`)."""
        return self._host_of

    @property
    def host_list(self) -> list[int]:
        """:attr:`host_of` as a list, for lookups one device at a time."""
        return self._host_list

    @property
    def hosts(self) -> int:
        """How many hosts the fleet spans."""
        return int(self._host_of.max()) + 1 if len(self.devices) else 0

    def routes_from(self, src: int) -> tuple[FloatArray, FloatArray]:
        """Latency and inverse bandwidth of the cheapest route from device ``src`` to every
        device (zero to itself): up to its host, the network hop to another host, down; or the
        devices' own link where that is cheaper. Hop by hop, summed in route order. The rows of
        latest sources are kept (read-only arrays), :data:`ROUTE_ROWS_BYTES` of them."""
        row = self._rows.get(src)
        if row is not None:
            self._rows.move_to_end(src)
            return row
        # Every device as if on another host (up + network, then down: the same sums in the
        # same order), then the source's own host without the network hop.
        up_latency = self._host_latency[src]
        up_inverse = self._host_inverse_bandwidth[src]
        latency = (up_latency + self._network_latency) + self._host_latency
        inverse = (up_inverse + self._network_inverse_bandwidth) + self._host_inverse_bandwidth
        same = self._members[self._host_of[src]]
        latency[same] = up_latency + self._host_latency[same]
        inverse[same] = up_inverse + self._host_inverse_bandwidth[same]
        direct = self._direct.get(src)
        if direct is not None:
            targets, direct_latency, direct_inverse = direct
            latency[targets] = direct_latency
            inverse[targets] = direct_inverse
        latency[src] = 0.0
        inverse[src] = 0.0
        latency.flags.writeable = False
        inverse.flags.writeable = False
        self._rows[src] = (latency, inverse)
        if len(self._rows) > self.rows_kept:
            self._rows.popitem(last=False)
        return latency, inverse

    def routes_to(
        self, src: int, targets: npt.NDArray[np.int64], hosts: list[int] | None = None
    ) -> tuple[FloatArray, FloatArray]:
        """:meth:`routes_from`'s entries for the devices ``targets`` only (the same sums, so
        the same figures), without building the fleet-wide row: a cached row is read.
        ``hosts``: the targets are those hosts' devices (a shortcut when ``src`` reaches none
        of them but over the network)."""
        row = self._rows.get(src)
        if row is not None:
            return row[0][targets], row[1][targets]
        up_latency = self._host_latency[src]
        up_inverse = self._host_inverse_bandwidth[src]
        last_latency = self._host_latency[targets]
        last_inverse = self._host_inverse_bandwidth[targets]
        latency = (up_latency + self._network_latency) + last_latency
        inverse = (up_inverse + self._network_inverse_bandwidth) + last_inverse
        if hosts is not None and self._near[src].isdisjoint(hosts):
            return latency, inverse
        same = self._host_of[targets] == self._host_of[src]
        latency[same] = up_latency + last_latency[same]
        inverse[same] = up_inverse + last_inverse[same]
        direct = self._direct.get(src)
        if direct is not None:
            peers, direct_latency, direct_inverse = direct
            slot = np.minimum(np.searchsorted(peers, targets), len(peers) - 1)
            linked = peers[slot] == targets
            latency[linked] = direct_latency[slot[linked]]
            inverse[linked] = direct_inverse[slot[linked]]
        itself = targets == src
        latency[itself] = 0.0
        inverse[itself] = 0.0
        return latency, inverse

    def remote_floor(self, src: int) -> tuple[float, float, frozenset[int]]:
        """Floors under the latency and the inverse bandwidth of :meth:`routes_from`'s entries
        (rounding included) from device ``src`` to every device outside the returned hosts:
        its own and those it has a direct link into (the rest are reached over the network)."""
        latency = float((self._host_latency[src] + self._network_latency) + self._latency_least)
        inverse = float(
            (self._host_inverse_bandwidth[src] + self._network_inverse_bandwidth)
            + self._inverse_least
        )
        return latency, inverse, self._near[src]

    def route(self, src: int, dst: int) -> tuple[float, float]:
        """Latency and inverse bandwidth of the cheapest route from device ``src`` to ``dst``."""
        if src == dst:
            return 0.0, 0.0
        direct = self._direct.get(src)
        if direct is not None:
            hit = np.flatnonzero(direct[0] == dst)
            if hit.size:
                return float(direct[1][hit[0]]), float(direct[2][hit[0]])
        latency = self._host_latency[src]
        inverse = self._host_inverse_bandwidth[src]
        if self._host_of[src] != self._host_of[dst]:
            latency += self._network_latency
            inverse += self._network_inverse_bandwidth
        return float(latency + self._host_latency[dst]), float(
            inverse + self._host_inverse_bandwidth[dst]
        )

    def stage(
        self,
        stage: str,
        variant: str,
        hint: BandwidthHint,
        allowed_classes: Sequence[str],
        min_residency_s: float,
        can_run: Callable[[str, str, str], bool],
    ) -> StageCosts:
        """Tables for one (stage, variant)."""
        count = len(self.devices)
        runnable = np.zeros(count, dtype=bool)
        marginal = np.zeros((count, hint.max_batch))
        load = np.zeros(count)
        why_not: list[str] = []
        rows: dict[tuple[float, float], FloatArray] = {}  # a fleet has few kinds of device
        batches: dict[tuple[float, float], tuple[float, ...]] = {}
        batch_s: list[tuple[float, ...]] = []
        for i, device in enumerate(self.devices):
            peak = device.peak_flops_for(hint.dtype)
            bandwidth = device.memory_bandwidth_bytes_per_s
            row = rows.get((peak, bandwidth))
            if row is None:
                times = [0.0] + [
                    hint.batch_seconds(peak, bandwidth, k) for k in range(1, hint.max_batch + 1)
                ]
                row = rows[(peak, bandwidth)] = np.diff(times)  # item 1 reads the weights
                batches[(peak, bandwidth)] = tuple(times)
            marginal[i] = row
            batch_s.append(batches[(peak, bandwidth)])
            load[i] = LOAD_INIT_S + hint.resident_bytes / host_link(device)[0]
            reason = ""
            if device.device_class.value not in allowed_classes:
                reason = f"class {device.device_class.value} not allowed"
            elif hint.resident_bytes > self.capacity[i]:
                reason = "model larger than the device's memory after the reserve"
            elif not can_run(stage, variant, device.id):
                reason = "its backend cannot run this variant's graph"
            runnable[i] = not reason
            why_not.append(reason)
        return StageCosts(
            key=f"{stage}/{variant}",
            stage=stage,
            variant=variant,
            hint=hint,
            runnable=runnable,
            marginal_s=marginal,
            load_s=load,
            min_residency_s=min_residency_s,
            why_not=tuple(why_not),
            batch_s=tuple(batch_s),
        )
