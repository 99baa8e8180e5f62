"""A device that joins a running fleet (a Ray node's) starts from what its kin measured.

The scheduler's per-device correction (measured run time over the cost model's, per stage)
starts at 1 for a device it has not seen run: a joining node's device would be placed on by
the cost model alone until its own runs correct it. Where the fleet already has a device that
is the same hardware and runtime (the same vendor name, class, memory, bandwidth and peak
FLOP/s, on the same backend of its node: another node's copy), the joining device starts from
that device's measured correction instead, for every stage, before the scheduler sends it any
work. Its own runs then correct it as usual. Nothing is measured on the joining device itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetero.framework.devices import DeviceSpec
from hetero.framework.scheduler.scheduler import Scheduler

__all__ = ["kin_of", "seed_from_kin"]


def _kind(device: DeviceSpec) -> tuple[object, ...]:
    runtime = device.properties.get("node_backend", device.backend)
    figures = (device.memory_bytes, device.memory_bandwidth_bytes_per_s, dict(device.peak_flops))
    return (device.vendor_name, device.device_class, runtime, *figures)


def kin_of(device: DeviceSpec, others: Sequence[DeviceSpec]) -> list[int]:
    """The indices in ``others`` of the devices that are the same hardware and runtime as
    ``device`` (its twins; none: empty)."""
    kind = _kind(device)
    return [at for at, other in enumerate(others) if _kind(other) == kind]


def seed_from_kin(scheduler: Scheduler, joined: Sequence[DeviceSpec]) -> dict[str, str]:
    """Give each device of ``joined`` (added to ``scheduler`` already) the measured correction
    of its kin among the devices that were there before, in every stage's table: per table,
    a twin whose correction moved from the cost model's 1 (it ran that stage), else the first
    twin. Which device seeded which, by id (the twin that seeded its first measured table)."""
    fresh = {device.id for device in joined}
    before = [device for device in scheduler.devices if device.id not in fresh]
    index = scheduler.fleet.index
    seeded: dict[str, str] = {}
    for device in joined:
        twins = [index[before[at].id] for at in kin_of(device, before)]
        if not twins:
            continue
        target, used = index[device.id], []
        for tables in scheduler.tables.values():
            ran = [twin for twin in twins if float(tables.correction[twin]) != 1.0]
            source = (ran or twins)[0]
            if ran:
                used.append(source)
            tables.correction[target] = tables.correction[source]
            tables.refresh(target)
        seeded[device.id] = scheduler.devices[(used or twins)[0]].id
    return seeded
