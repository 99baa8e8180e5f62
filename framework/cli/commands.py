"""The ``devices`` and ``plan`` commands."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from hetero.framework.cli.units import bytes_text, rate_text, seconds_text
from hetero.framework.devices import DeviceSpec
from hetero.framework.fleet import Fleet, discover_devices, resolve_fleet
from hetero.framework.output import print_json
from hetero.framework.plan import DeviceCost, plan_policy
from hetero.framework.policy import load_policy
from hetero.framework.registry import Detection, Registry
from hetero.framework.stage_plugin import plugin_hints, stage_plugins
from hetero.framework.topology import Topology


def _flops_text(device: DeviceSpec) -> str:
    return ", ".join(
        f"{dtype} {rate_text(v, '')}" for dtype, v in sorted(device.peak_flops.items())
    )


def _links_text(device: DeviceSpec) -> str:
    if not device.links:
        return "-"
    kinds: dict[str, int] = {}
    for link in device.links:
        kinds[link.kind.value] = kinds.get(link.kind.value, 0) + 1
    return ", ".join(f"{count} x {kind}" for kind, count in sorted(kinds.items()))


def devices_table(
    devices: list[DeviceSpec] | tuple[DeviceSpec, ...],
    title: str,
    extra: Mapping[str, Mapping[str, str]] | None = None,
) -> Table:
    """A rich table of device specs; ``extra`` adds columns (name -> device id -> text)."""
    table = Table(title=title, title_justify="left")
    columns = ("device", "class", "name", "memory", "bandwidth", "peak FLOP/s", "links")
    for column in (*columns, *(extra or {})):
        table.add_column(column, overflow="fold")
    for device in devices:
        table.add_row(
            device.id,
            device.device_class.value,
            device.vendor_name,
            bytes_text(device.memory_bytes),
            rate_text(device.memory_bandwidth_bytes_per_s, "B/s"),
            _flops_text(device),
            _links_text(device),
            *(values.get(device.id, "-") for values in (extra or {}).values()),
        )
    return table


def vllm_availability(
    devices: Sequence[DeviceSpec], unavailable: Sequence[Detection]
) -> dict[str, str]:
    """Per device, whether an LLM stage can run on vLLM there: ``engine`` on a vllm device,
    the vllm device that serves it, or why not (``not installed``)."""
    missing = next((d.reason for d in unavailable if d.name == "vllm"), None)
    served = {str(d.properties.get("serves")): d.id for d in devices if d.backend == "vllm"}
    column: dict[str, str] = {}
    for device in devices:
        if device.backend == "vllm":
            runtime = device.properties.get("runtime_version", "vllm")
            column[device.id] = f"engine: {runtime}, {device.properties.get('max_num_seqs')} seqs"
        elif device.id in served:
            column[device.id] = f"yes: {served[device.id]}"
        elif missing is not None:
            column[device.id] = missing.split(" (", 1)[0]
        else:
            column[device.id] = "no"
    return column


TOPOLOGY_PROBE_BYTES = 64 * 2**20
_SHORT_KIND = {"nvlink": "NVL", "xgmi": "XGMI", "pcie": "PCIe", "network": "NET", "host": "HOST"}


def _route_text(topology: Topology, src: str, dst: str) -> str:
    if src == dst:
        return "X"
    hops = topology.route(TOPOLOGY_PROBE_BYTES, src, dst)
    if len(hops) == 1:
        hop = hops[0]
        return f"{_SHORT_KIND.get(hop.kind, hop.kind)} {rate_text(hop.bandwidth_bytes_per_s, '')}"
    return "NET" if any(hop.kind == "network" for hop in hops) else "HOST"


# Above this many devices the device-by-device matrix is drawn for one host of each shape, and
# the hosts' network is one line: a 1,000-device matrix is a million cells nobody reads.
MATRIX_DEVICES = 16


def topology_table(topology: Topology, devices: tuple[DeviceSpec, ...] | None = None) -> Table:
    """An ``nvidia-smi topo -m`` style matrix: the direct link, or how a transfer is routed."""
    ids = [device.id for device in devices or topology.devices]
    table = Table(
        title=f"Topology (route for {bytes_text(TOPOLOGY_PROBE_BYTES)} transfers)",
        title_justify="left",
    )
    table.add_column("")
    for device_id in ids:
        table.add_column(device_id.split(":", 1)[1])
    for src in ids:
        table.add_row(src, *(_route_text(topology, src, dst) for dst in ids))
    return table


def _by_host(devices: tuple[DeviceSpec, ...]) -> dict[str, tuple[DeviceSpec, ...]]:
    hosts: dict[str, list[DeviceSpec]] = {}
    for device in devices:
        hosts.setdefault(device.host, []).append(device)
    return {host: tuple(members) for host, members in hosts.items()}


def _topology_json(topology: Topology) -> dict[str, Any]:
    """Routes factored as the topology builds them: every pair inside a host and every pair
    with its own link (``pairs``), the ``hosts``, and the ``network`` hop joining any two of
    them (a device on host A reaches one on host B through its host link, that hop, and the
    other's host link). O(devices + links), not devices squared."""

    def pair(src: str, dst: str) -> dict[str, Any]:
        hops = topology.route(TOPOLOGY_PROBE_BYTES, src, dst)
        return {
            "src": src,
            "dst": dst,
            "route": [hop.kind for hop in hops],
            "bandwidth_bytes_per_s": min(hop.bandwidth_bytes_per_s for hop in hops),
            "transfer_s_64MiB": sum(hop.seconds(TOPOLOGY_PROBE_BYTES) for hop in hops),
        }

    pairs: list[dict[str, Any]] = []
    hosts = _by_host(topology.devices)
    for members in hosts.values():
        for src in members:
            pairs.extend(pair(src.id, dst.id) for dst in members if dst.id != src.id)
            pairs.extend(
                pair(src.id, hop.dst)
                for hop in topology.direct_peers(src.id)
                if topology.device(hop.dst).host != src.host
            )
    network: dict[str, Any] | None = None
    if len(hosts) > 1:
        first, second = list(hosts)[:2]
        hop = topology.network_hop(first, second)  # every pair of hosts has this link
        network = {
            "route": [hop.kind],
            "bandwidth_bytes_per_s": hop.bandwidth_bytes_per_s,
            "latency_s": hop.latency_s,
        }
    return {"pairs": pairs, "hosts": list(hosts), "network": network}


def _print_topology(console: Console, topology: Topology) -> None:
    devices = topology.devices
    if len(devices) <= MATRIX_DEVICES:
        console.print(topology_table(topology))
        return
    hosts = _by_host(devices)
    shapes: dict[tuple[str, ...], list[str]] = {}
    for host, members in hosts.items():
        shapes.setdefault(tuple(d.vendor_name for d in members), []).append(host)
    for alike in shapes.values():
        host = alike[0]
        console.print(f"Host {host} ({len(alike)} host(s) of this shape):")
        console.print(topology_table(topology, hosts[host]))
    if len(hosts) > 1:
        first, second = list(hosts)[:2]
        hop = topology.network_hop(first, second)
        console.print(
            f"{len(hosts)} hosts, each pair joined by the network: "
            f"{rate_text(hop.bandwidth_bytes_per_s, 'B/s')}, {seconds_text(hop.latency_s)}"
        )


def run_policy_devices(
    console: Console, registry: Registry, policy_path: str, as_json: bool
) -> int:
    """The devices a policy would use here (or its simulated fleet), with their topology."""
    policy = load_policy(policy_path)
    fleet = resolve_fleet(policy, registry)
    topology = fleet.topology()
    if as_json:
        payload = {
            "policy": policy.spec.name,
            "simulated": fleet.simulated,
            "devices": [device.to_dict() for device in fleet.devices],
            "unavailable": {d.name: d.reason for d in fleet.unavailable},
            "excluded": dict(fleet.excluded),
            "topology": _topology_json(topology),
        }
        print_json(console, payload)
        return 0
    title = f"Devices of policy {policy.spec.name!r}" + (" (simulated)" if fleet.simulated else "")
    console.print(devices_table(fleet.devices, title))
    _print_fleet_notes(console, fleet)
    if len(fleet.devices) > 1:
        _print_topology(console, topology)
    return 0


def run_devices(console: Console, registry: Registry, as_json: bool) -> int:
    """List every device of every available backend, and why the others are unavailable."""
    devices, unavailable = discover_devices(registry)
    detections = registry.detections()
    vllm = vllm_availability(devices, unavailable)
    if as_json:
        payload: dict[str, Any] = {
            "backends": [
                {
                    "name": d.name,
                    "available": d.available,
                    "reason": next((u.reason for u in unavailable if u.name == d.name), d.reason),
                    "priority": d.priority,
                    "simulated": d.simulated,
                }
                for d in detections
            ],
            "devices": [{**device.to_dict(), "vllm": vllm[device.id]} for device in devices],
            "unavailable": {d.name: d.reason for d in unavailable},
        }
        print_json(console, payload)
        return 0
    console.print(devices_table(devices, "Devices", {"vllm": vllm}))
    for detection in unavailable:
        console.print(f"[yellow]{detection.name}[/]: {detection.reason}", highlight=False)
    return 0


def _print_fleet_notes(console: Console, fleet: Fleet) -> None:
    for detection in fleet.unavailable:
        console.print(f"[yellow]{detection.name}[/]: {detection.reason}", highlight=False)
    for device_id, reason in fleet.excluded:
        console.print(f"[dim]{device_id}: {reason}[/]", highlight=False)


def _alike_runs(costs: tuple[DeviceCost, ...]) -> list[tuple[DeviceCost, int]]:
    """Devices in cost order, a run of identical costs as its first device and the run's
    length: a 1,000-device fleet of eight-GPU hosts is a few rows, not thousands."""
    runs: list[tuple[DeviceCost, int]] = []
    for cost in costs:
        if runs and _same_cost(runs[-1][0], cost):
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((cost, 1))
    return runs


def _same_cost(a: DeviceCost, b: DeviceCost) -> bool:
    return (a.per_item_s, a.bound, a.load_s) == (b.per_item_s, b.bound, b.load_s)


def run_plan(console: Console, registry: Registry, policy_path: str, as_json: bool) -> int:
    """Validate a policy and print, per stage, eligible devices and roofline cost per item."""
    policy = load_policy(policy_path)
    fleet = resolve_fleet(policy, registry)
    plans = plan_policy(policy, fleet, plugin_hints(policy, stage_plugins(registry)))
    if as_json:
        payload = {
            "policy": policy.spec.name,
            "source": policy.source,
            "valid": True,
            "simulated": fleet.simulated,
            "devices": [device.to_dict() for device in fleet.devices],
            "unavailable": {d.name: d.reason for d in fleet.unavailable},
            "excluded": {device_id: reason for device_id, reason in fleet.excluded},
            "stages": [plan.to_dict() for plan in plans],
            "routes": dict(policy.spec.routes),
            "pipelines": {name: list(p.order) for name, p in sorted(policy.pipelines.items())},
        }
        print_json(console, payload)
        return 0
    console.print(
        f"[green]policy {policy.spec.name!r} ({policy.source}) is valid[/]: "
        f"{len(policy.spec.stages)} stages, {len(policy.pipelines)} pipelines, "
        f"{len(policy.spec.routes)} routes, {len(fleet.devices)} devices"
        + (" (simulated)" if fleet.simulated else ""),
        highlight=False,
    )
    _print_fleet_notes(console, fleet)
    table = Table(title="Roofline cost per item", title_justify="left")
    for column in ("stage", "variant", "FLOP/byte", "device", "per item", "bound", "load"):
        table.add_column(column, overflow="fold")
    for plan in plans:
        if not plan.costs:
            table.add_row(plan.stage, plan.variant, "", "[red]no eligible device[/]", "", "", "")
        for index, (cost, alike) in enumerate(_alike_runs(plan.costs)):
            first = index == 0
            table.add_row(
                plan.stage if first else "",
                plan.variant if first else "",
                f"{plan.arithmetic_intensity:.3g}" if first else "",
                cost.device_id if alike == 1 else f"{cost.device_id} and {alike - 1} alike",
                seconds_text(cost.per_item_s),
                cost.bound,
                seconds_text(cost.load_s),
            )
    console.print(table)
    route_table = Table(title="Routes", title_justify="left")
    route_table.add_column("route")
    route_table.add_column("pipeline (steps joined by + run in parallel)")
    for route, target in sorted(policy.spec.routes.items()):
        levels = policy.pipelines[target].levels
        route_table.add_row(route, f"{target}: " + " -> ".join(" + ".join(lv) for lv in levels))
    console.print(route_table)
    return 0
