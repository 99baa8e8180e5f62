"""The devices a policy may use: discovered through the registry or declared as simulated,
then filtered by the policy's allow/deny rules and corrected by its overrides.

A policy that declares simulated devices plans for hardware that is not on the desk, so its
fleet is those devices alone; a policy with ``cluster.engine: ray`` runs on its cluster's
devices, through the cluster engine the ``hetero.plugins`` entry point ``ray`` registers
(:func:`hetero.framework.cluster.register`: the cluster sits above the engine, so this module
never imports it); otherwise the fleet is what the available backends discover.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hetero.framework.backend import Backend
from hetero.framework.devices import DeviceClass, DeviceSpec, Link, LinkKind
from hetero.framework.errors import BackendUnavailableError, HeteroError
from hetero.framework.policy import Policy
from hetero.framework.policy.references import resolve_group
from hetero.framework.policy.schema import (
    ClusterConfig,
    DeviceOverride,
    DevicesConfig,
    SimulatedDeviceGroup,
)
from hetero.framework.registry import Detection, Registry
from hetero.framework.topology import Topology

__all__ = [
    "CLUSTER_ENGINE",
    "Cluster",
    "Fleet",
    "backend_for",
    "discover_devices",
    "resolve_fleet",
    "simulated_devices",
]

logger = logging.getLogger(__name__)

SIM_BACKEND = "sim"
# The registry's extension kind of a cluster engine: ``connect(ClusterConfig) -> Cluster``.
CLUSTER_ENGINE = "cluster_engine"


class Cluster(Protocol):
    """A connection to a cluster of nodes, as the fleet uses it."""

    @property
    def devices(self) -> Sequence[DeviceSpec]:
        """The devices of every node that has joined."""
        ...

    @property
    def backend(self) -> Backend:
        """The backend that runs work on those devices, on their nodes."""
        ...


def _cluster(policy: Policy, registry: Registry) -> Cluster:
    """The connection to the policy's cluster, through the cluster engine registered under
    ``cluster.engine``'s name."""
    config = policy.spec.cluster
    engines: dict[str, Callable[[ClusterConfig], Cluster]] = registry.extensions(CLUSTER_ENGINE)
    connect = engines.get(config.engine)
    if connect is None:
        raise BackendUnavailableError(
            config.engine,
            f"no cluster engine {config.engine!r} is registered: hetero's hetero.plugins entry"
            f" point {config.engine!r} registers it (reinstall hetero if it is missing; a"
            " Registry(use_entry_points=False) has none)",
        )
    return connect(config)


@dataclass(frozen=True, slots=True)
class Fleet:
    """Devices in use, plus what was left out and why.

    Attributes:
        devices: Devices the policy may place work on.
        unavailable: Backends that could not run here, with their reasons.
        excluded: ``(device id, reason)`` for devices the policy denied or did not allow.
        simulated: Whether the devices come from the policy's ``devices.simulated``.
    """

    devices: tuple[DeviceSpec, ...]
    unavailable: tuple[Detection, ...] = ()
    excluded: tuple[tuple[str, str], ...] = ()
    simulated: bool = False
    network_bandwidth_bytes_per_s: float = 25e9
    network_latency_s: float = 5e-6

    def topology(self) -> Topology:
        """The topology model of these devices."""
        return Topology(
            self.devices,
            network_bandwidth_bytes_per_s=self.network_bandwidth_bytes_per_s,
            network_latency_s=self.network_latency_s,
        )


def discover_devices(registry: Registry) -> tuple[list[DeviceSpec], list[Detection]]:
    """Every device of every available hardware backend, and the backends that are not available.

    A backend that fails while discovering is reported as unavailable, never raised: a broken
    vendor library must not stop start-up. Simulated backends are not hardware and are left out.
    """
    devices: list[DeviceSpec] = []
    unavailable: list[Detection] = []
    for detection in registry.detections():
        if detection.simulated:
            continue
        if not detection.available:
            unavailable.append(detection)
            continue
        try:
            devices.extend(registry.backend(detection.name).devices())
        except HeteroError as err:
            logger.warning("%s: %s", detection.name, err)
            unavailable.append(Detection.missing(detection.name, str(err)))
    return devices, unavailable


def simulated_devices(groups: tuple[SimulatedDeviceGroup, ...]) -> list[DeviceSpec]:
    """DeviceSpecs for the policy's simulated groups: ``count`` devices on each of ``hosts``
    hosts (``<host>-<n>`` when there are several), ids ``sim:<name>-<index>`` numbered across
    the group; the devices of one host are fully linked."""
    devices: list[DeviceSpec] = []
    for group in groups:
        figures = resolve_group(group)
        for host_index in range(group.hosts):
            host = group.host if group.hosts == 1 else f"{group.host}-{host_index}"
            first = host_index * group.count
            ids = [f"{SIM_BACKEND}:{group.name}-{i}" for i in range(first, first + group.count)]
            devices.extend(_host_devices(group, figures, host, ids))
    return devices


def _host_devices(
    group: SimulatedDeviceGroup, figures: Mapping[str, Any], host: str, ids: list[str]
) -> list[DeviceSpec]:
    devices = []
    interconnect = figures["interconnect"]
    for device_id in ids:
        links: tuple[Link, ...] = ()
        if interconnect != "none" and figures.get("interconnect_bandwidth"):
            links = tuple(
                Link(
                    peer=peer,
                    kind=LinkKind(interconnect),
                    bandwidth_bytes_per_s=figures["interconnect_bandwidth"],
                )
                for peer in ids
                if peer != device_id
            )
        properties: dict[str, object] = {"simulated": True, "group": group.name}
        if group.preset:
            properties["preset"] = group.preset
        for key in ("site", "zone"):
            if getattr(group, key) is not None:
                properties[key] = getattr(group, key)
        if figures.get("host_bandwidth"):
            properties["host_bandwidth_bytes_per_s"] = figures["host_bandwidth"]
        devices.append(
            DeviceSpec(
                id=device_id,
                device_class=DeviceClass(figures["class"]),
                vendor_name=figures["vendor_name"],
                backend=SIM_BACKEND,
                host=host,
                memory_bytes=int(figures["memory"]),
                peak_flops=dict(figures["peak_flops"]),
                memory_bandwidth_bytes_per_s=figures["memory_bandwidth"],
                links=links,
                properties=properties,
            )
        )
    return devices


def _matches(pattern: str, device: DeviceSpec) -> bool:
    # A cluster node's device answers to its own backend's name too (npu, not only ray).
    names: tuple[str, ...] = (device.id, device.backend, device.device_class.value)
    node_backend = device.properties.get("node_backend")
    if isinstance(node_backend, str):
        names += (node_backend,)
    return any(fnmatch.fnmatchcase(name, pattern) for name in names)


def _override(device: DeviceSpec, override: DeviceOverride) -> DeviceSpec:
    changes: dict[str, object] = {}
    if override.memory is not None:
        changes["memory_bytes"] = override.memory
    if override.memory_bandwidth is not None:
        changes["memory_bandwidth_bytes_per_s"] = override.memory_bandwidth
    if override.peak_flops is not None:
        changes["peak_flops"] = {**device.peak_flops, **override.peak_flops}
    if override.links is not None:
        changes["links"] = tuple(
            Link(
                peer=link.peer,
                kind=LinkKind(link.kind),
                bandwidth_bytes_per_s=link.bandwidth,
                latency_s=link.latency_us * 1e-6,
            )
            for link in override.links
        )
    if override.numa_node is not None:
        changes["numa_node"] = override.numa_node
    place = {key: getattr(override, key) for key in ("site", "zone") if getattr(override, key)}
    if place:
        changes["properties"] = {**device.properties, **place}
    return dataclasses.replace(device, **changes) if changes else device  # type: ignore[arg-type]


def apply_device_rules(
    devices: list[DeviceSpec], config: DevicesConfig
) -> tuple[list[DeviceSpec], list[tuple[str, str]]]:
    """Filter by allow/deny (patterns on id, backend or class) and apply overrides by id."""
    kept: list[DeviceSpec] = []
    excluded: list[tuple[str, str]] = []
    for device in devices:
        denied = next((p for p in config.deny if _matches(p, device)), None)
        if denied is not None:
            excluded.append((device.id, f"denied by devices.deny {denied!r}"))
            continue
        if not any(_matches(p, device) for p in config.allow):
            excluded.append((device.id, "not matched by devices.allow"))
            continue
        override = config.overrides.get(device.id)
        kept.append(_override(device, override) if override is not None else device)
    return kept, excluded


def resolve_fleet(policy: Policy, registry: Registry) -> Fleet:
    """The fleet ``policy`` runs on: its simulated devices, else the devices of every node of
    its Ray cluster (``cluster.engine: ray``), else what this host's backends discover."""
    config = policy.spec.devices
    unavailable: list[Detection] = []
    if config.simulated:
        found = simulated_devices(config.simulated)
    elif policy.spec.cluster.engine == "ray":
        found = list(_cluster(policy, registry).devices)
    else:
        found, unavailable = discover_devices(registry)
    devices, excluded = apply_device_rules(found, config)
    return Fleet(
        devices=tuple(devices),
        unavailable=tuple(unavailable),
        excluded=tuple(excluded),
        simulated=bool(config.simulated),
        network_bandwidth_bytes_per_s=config.network.bandwidth,
        network_latency_s=config.network.latency_us * 1e-6,
    )


def backend_for(name: str, policy: Policy, registry: Registry) -> Backend:
    """The backend that runs a fleet's devices of backend ``name``: the registry's, or, for a
    Ray cluster's devices, the backend over its node agents."""
    if name == "ray" and policy.spec.cluster.engine == "ray":
        return _cluster(policy, registry).backend
    return registry.backend(name)
