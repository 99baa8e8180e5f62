"""Live per-device state of one (stage, variant), kept as arrays so a decision is a few vector
operations, and which devices share their compute."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hetero.framework.devices import DeviceSpec
from hetero.framework.scheduler.costs import StageCosts

__all__ = ["StageTables", "compute_groups"]


@dataclass(slots=True)
class StageTables:
    """Live per-device state of one (stage, variant), kept so a decision is a few vector ops."""

    costs: StageCosts
    pending: np.ndarray  # tasks dispatched to each device, not yet finished
    correction: np.ndarray  # measured over modelled, per device
    resident: np.ndarray
    load_now: np.ndarray  # load time if placed there now: 0 where resident
    next_compute: np.ndarray  # what one more item adds there now (batch slot x correction)
    unit_s: np.ndarray  # one item alone there (first batch slot x correction)
    limit: np.ndarray  # tasks that may be outstanding per device: a batch per run slot
    slots: np.ndarray  # batches a device runs at once (a task queues behind 1 / slots of it)
    resident_bytes: np.ndarray  # memory the model holds per device (an engine's KV cache too)
    draining: np.ndarray  # devices where this model gets no new work: an overdue task waits
    has_room: np.ndarray  # pending below limit: the device may take one more task of it
    # The bounded search's per-host floor of the cost before transfer (None: not yet built),
    # and the devices whose entries moved since it was last brought up to date.
    host_floor: np.ndarray | None = None
    local: np.ndarray | None = None  # each device's estimate before transfer, for the floors
    moved: set[int] = field(default_factory=set)
    fastest_s: float | None = None  # the least unit_s over runnable healthy devices (None: stale)
    # The variant's dispatch_ahead_ms in seconds (None: a device takes up to a batch per run
    # slot): a device is given a task only while the batch of what it holds, as the cost model
    # times it there (correction included), fits in this; one task always fits.
    ahead_s: float | None = None

    @classmethod
    def fresh(cls, costs: StageCosts, count: int, ahead_s: float | None = None) -> StageTables:
        """Tables of ``count`` devices with nothing dispatched, resident or measured yet."""
        tables = cls(
            costs=costs,
            pending=np.zeros(count, np.int64),
            correction=np.ones(count),
            resident=np.zeros(count, bool),
            load_now=costs.load_s.copy(),
            next_compute=costs.marginal_s[:, 0].copy(),
            unit_s=costs.marginal_s[:, 0].copy(),
            limit=np.full(count, costs.hint.max_batch, np.int64),
            slots=np.ones(count, np.int64),
            resident_bytes=np.full(count, costs.hint.resident_bytes, np.int64),
            draining=np.zeros(count, bool),
            has_room=np.full(count, costs.hint.max_batch > 0, bool),
            ahead_s=ahead_s,
        )
        if ahead_s is not None:
            for index in range(count):
                tables.limit[index] = tables.room(index)
        return tables

    def room(self, index: int) -> int:
        """Tasks device ``index`` may hold: a batch per run slot, and with ``ahead_s`` only as
        many as the cost model's batch of them there (times its correction) fits in it, at
        least one."""
        slots = int(self.slots[index])
        most = self.costs.hint.max_batch * slots
        ahead_s, batch_s = self.ahead_s, self.costs.batch_s
        if ahead_s is None or not batch_s or slots > 1:  # several slots: tasks run side by side
            return most
        # batch_s[index][k] is a batch of k (k = 0 included): the largest k that fits.
        correction = max(float(self.correction[index]), 1e-9)
        fits = bisect_right(batch_s[index], ahead_s / correction) - 1
        return min(most, max(1, fits))

    def fit(self, index: int, slots: int, resident_bytes: int | None) -> None:
        """Device ``index`` runs ``slots`` batches at once and holds ``resident_bytes``."""
        self.slots[index] = slots
        self.limit[index] = self.room(index)
        self.has_room[index] = self.pending[index] < self.limit[index]
        if resident_bytes is not None:
            self.resident_bytes[index] = resident_bytes

    def refresh(self, index: int) -> None:
        """Recompute one device's entries after its pending count, correction or residency moved."""
        costs = self.costs
        pending = int(self.pending[index])
        correction = self.correction[index]
        row = costs.marginal_s[index]
        self.next_compute[index] = row[min(pending, costs.hint.max_batch - 1)] * correction
        unit = row[0] * correction
        was = self.unit_s[index]
        if unit != was:
            self.unit_s[index] = unit
            fastest = self.fastest_s
            # The least unit time stands unless this device may be, or may have been, it.
            if fastest is not None and (unit < fastest or was <= fastest):
                self.fastest_s = None
        self.load_now[index] = 0.0 if self.resident[index] else costs.load_s[index]
        if self.ahead_s is not None:  # the correction may have moved what fits
            self.limit[index] = self.room(index)
        self.has_room[index] = pending < self.limit[index]
        self.moved.add(index)


def compute_groups(devices: Sequence[DeviceSpec]) -> np.ndarray:
    """A group number per device: devices that draw on one compute resource
    (:attr:`DeviceSpec.compute_id`: the runtimes over one host's cores, a mirror and the
    device it serves) share one; every other device is its own."""
    keys: dict[str, int] = {}
    out = np.zeros(len(devices), dtype=np.int64)
    for index, device in enumerate(devices):
        out[index] = keys.setdefault(device.compute_id, len(keys))
    return out
