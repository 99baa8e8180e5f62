"""Data locality: whether a device is where a stage's locality constraint says it must (or
should) run. A device's site and zone are its ``properties`` (``devices.simulated[].site`` /
``.zone`` or ``devices.overrides.<id>.site`` / ``.zone``); its host and NUMA node are its own
fields. The scheduler, the simulator (through it) and ``hetero plan`` all ask here."""

from __future__ import annotations

from hetero.framework.devices import DeviceSpec
from hetero.framework.policy.schema import LocalityConfig

__all__ = ["locality_mismatch"]


def locality_mismatch(constraint: LocalityConfig | None, device: DeviceSpec) -> str:
    """ "" when ``device`` satisfies ``constraint`` (or there is none), else why not."""
    if constraint is None:
        return ""
    have = {
        "site": device.properties.get("site"),
        "zone": device.properties.get("zone"),
        "host": device.host,
        "numa_node": device.numa_node,
    }
    for key, value in have.items():
        wanted = getattr(constraint, key)
        if wanted is not None and wanted != value:
            shown = "none" if value is None else value
            return f"locality: the stage {constraint.mode}s {key} {wanted} (device: {shown})"
    return ""
