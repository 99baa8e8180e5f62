"""Routes factored into "inside a host" and "host to host" are the routes a shortest-path search
over the whole topology graph finds, bit for bit: the scheduler's placement cannot change."""

from __future__ import annotations

import heapq
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.framework.devices import DeviceClass, DeviceSpec, Link, LinkKind
from hetero.framework.scheduler.costs import ROUTE_PROBE_BYTES, FleetCosts
from hetero.framework.topology import HOST_PREFIX, Hop, Topology


def searched_route(topology: Topology, size: float, src: str, dst: str) -> tuple[Hop, ...]:
    """The route by Dijkstra over every node (the implementation the factoring replaced)."""
    edges = {node: dict(hops) for node, hops in topology._edges.items()}
    for a in topology.hosts:  # the host mesh, as the graph used to hold it
        for b in topology.hosts - {a}:
            edges[HOST_PREFIX + a][HOST_PREFIX + b] = topology.network_hop(a, b)
    best: dict[str, float] = {src: 0.0}
    came_by: dict[str, Hop] = {}
    frontier: list[tuple[float, str]] = [(0.0, src)]
    while frontier:
        cost, node = heapq.heappop(frontier)
        if node == dst:
            break
        if cost > best.get(node, float("inf")):
            continue
        for hop in edges.get(node, {}).values():
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
        hops.append(came_by[node])
        node = came_by[node].src
    return tuple(reversed(hops))


def random_fleet(seed: int) -> list[DeviceSpec]:
    """A few hosts of devices with links of every kind and speed, some across hosts and some
    slower than the host path, so both kinds of route win somewhere."""
    rng = random.Random(seed)
    hosts = rng.randint(1, 4)
    ids = [f"sim:d{i}" for i in range(rng.randint(2, 12))]
    devices = []
    for device_id in ids:
        links = tuple(
            Link(
                peer=peer,
                kind=rng.choice(list(LinkKind)),
                bandwidth_bytes_per_s=rng.choice([1e9, 8e9, 50e9, 300e9]),
                latency_s=rng.choice([0.0, 2e-6, 50e-6]),
            )
            for peer in ids
            if peer != device_id and rng.random() < 0.4
        )
        cpu = rng.random() < 0.2
        devices.append(
            DeviceSpec(
                id=device_id,
                device_class=DeviceClass.CPU if cpu else DeviceClass.CUDA,
                vendor_name="test",
                backend="sim",
                host=f"h{rng.randrange(hosts)}",
                memory_bytes=1 << 30,
                peak_flops={"fp32": 1e12},
                memory_bandwidth_bytes_per_s=rng.choice([100e9, 2e12]),
                links=links,
                properties={"host_bandwidth_bytes_per_s": rng.choice([8e9, 32e9, 64e9])},
            )
        )
    return devices


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.sampled_from([1.0, 1e6, 64 * 2**20, 1e10]))
def test_factored_routes_equal_the_full_search(seed: int, size: float) -> None:
    devices = random_fleet(seed)
    topology = Topology(devices, network_bandwidth_bytes_per_s=12.5e9, network_latency_s=8e-6)
    for src in devices:
        for dst in devices:
            assert topology.route(size, src.id, dst.id) == searched_route(
                topology, size, src.id, dst.id
            )


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_fleet_route_rows_equal_the_dense_tables_bit_for_bit(seed: int) -> None:
    devices = random_fleet(seed)
    topology = Topology(devices)
    count = len(devices)
    latency = np.zeros((count, count))
    inverse = np.zeros((count, count))
    for i, src in enumerate(devices):  # the dense tables FleetCosts used to keep
        for j, dst in enumerate(devices):
            if i != j:
                hops = searched_route(topology, ROUTE_PROBE_BYTES, src.id, dst.id)
                latency[i, j] = sum(h.latency_s for h in hops)
                inverse[i, j] = sum(1 / h.bandwidth_bytes_per_s for h in hops)
    fleet = FleetCosts(devices, topology, [d.memory_bytes for d in devices])
    for i in range(count):
        row_latency, row_inverse = fleet.routes_from(i)
        assert row_latency.tolist() == latency[i].tolist()
        assert row_inverse.tolist() == inverse[i].tolist()
        for j in range(count):
            assert fleet.route(i, j) == (latency[i, j], inverse[i, j])
