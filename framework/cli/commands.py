"""The ``devices`` and ``plan`` commands."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from hetero.framework.cli.units import bytes_text, rate_text, seconds_text
from hetero.framework.devices import DeviceSpec
from hetero.framework.fleet import Fleet, discover_devices, resolve_fleet
from hetero.framework.plan import plan_policy
from hetero.framework.policy import load_policy
from hetero.framework.registry import Registry


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


def devices_table(devices: list[DeviceSpec] | tuple[DeviceSpec, ...], title: str) -> Table:
    """A rich table of device specs."""
    table = Table(title=title, title_justify="left")
    for column in ("device", "class", "name", "memory", "bandwidth", "peak FLOP/s", "links"):
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
        )
    return table


def run_devices(console: Console, registry: Registry, as_json: bool) -> int:
    """List every device of every available backend, and why the others are unavailable."""
    devices, unavailable = discover_devices(registry)
    detections = registry.detections()
    if as_json:
        payload: dict[str, Any] = {
            "backends": [
                {
                    "name": d.name,
                    "available": d.available,
                    "reason": next((u.reason for u in unavailable if u.name == d.name), d.reason),
                    "priority": d.priority,
                }
                for d in detections
            ],
            "devices": [device.to_dict() for device in devices],
            "unavailable": {d.name: d.reason for d in unavailable},
        }
        console.print_json(json.dumps(payload))
        return 0
    console.print(devices_table(devices, "Devices"))
    for detection in unavailable:
        console.print(f"[yellow]{detection.name}[/]: {detection.reason}", highlight=False)
    return 0


def _print_fleet_notes(console: Console, fleet: Fleet) -> None:
    for detection in fleet.unavailable:
        console.print(f"[yellow]{detection.name}[/]: {detection.reason}", highlight=False)
    for device_id, reason in fleet.excluded:
        console.print(f"[dim]{device_id}: {reason}[/]", highlight=False)


def run_plan(console: Console, registry: Registry, policy_path: str, as_json: bool) -> int:
    """Validate a policy and print, per stage, eligible devices and roofline cost per item."""
    policy = load_policy(policy_path)
    fleet = resolve_fleet(policy, registry)
    plans = plan_policy(policy, fleet)
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
            "pipelines": {name: list(p.order) for name, p in policy.pipelines.items()},
        }
        console.print_json(json.dumps(payload))
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
        for index, cost in enumerate(plan.costs):
            first = index == 0
            table.add_row(
                plan.stage if first else "",
                plan.variant if first else "",
                f"{plan.arithmetic_intensity:.3g}" if first else "",
                cost.device_id,
                seconds_text(cost.per_item_s),
                cost.bound,
                seconds_text(cost.load_s),
            )
    console.print(table)
    route_table = Table(title="Routes", title_justify="left")
    route_table.add_column("route")
    route_table.add_column("pipeline (DAG order)")
    for route, target in sorted(policy.spec.routes.items()):
        route_table.add_row(route, f"{target}: " + " -> ".join(policy.pipelines[target].order))
    console.print(route_table)
    return 0
