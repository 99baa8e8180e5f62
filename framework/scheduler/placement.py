"""Placement: which eligible device a task goes to, by the cost model (queue + load + compute +
transfer, vectorised over the fleet), round robin or least connections, and why a task can go
nowhere."""

from __future__ import annotations

import numpy as np

from hetero.framework.scheduler.breakers import BreakerState
from hetero.framework.scheduler.costs import StageCosts
from hetero.framework.scheduler.state import SchedulerState
from hetero.framework.scheduler.tables import StageTables
from hetero.framework.scheduler.tasks import StageTask

__all__ = ["PlacementMixin"]


class PlacementMixin(SchedulerState):
    """Eligibility masks and the choice of a device among them."""

    def _group_backlog(self) -> np.ndarray:
        """Each device's backlog summed over the devices that share its compute."""
        groups = self._compute_group
        summed: np.ndarray = np.bincount(groups, weights=self.backlog)[groups]
        return summed

    def _refresh_breakers(self, stage: str, now: float) -> np.ndarray:
        blocked = self._breaker_blocked[stage]
        for index in list(self._not_closed[stage]):
            breaker = self._breakers[(stage, index)]
            blocked[index] = not breaker.allows(now)
            if breaker.state is BreakerState.CLOSED:
                self._not_closed[stage].discard(index)
        return blocked

    def _transfer(self, task: StageTask, tables: StageTables) -> np.ndarray:
        fleet = self.fleet
        if not task.inputs:
            size = tables.costs.hint.input_bytes * task.items
            return size * fleet.ingress_inverse_bandwidth
        if self.outputs_on_host:
            return sum(h.size_bytes for h in task.inputs) * fleet.ingress_inverse_bandwidth
        total: np.ndarray | None = None
        for handle in task.inputs:
            src = fleet.index.get(handle.device_id)
            if src is None:
                # The device that holds the output is gone (unhealthy, removed): the engine
                # keeps outputs as host arrays, so it costs a host-to-device copy.
                cost = handle.size_bytes * fleet.ingress_inverse_bandwidth
            else:
                latency, inverse_bandwidth = fleet.routes_from(src)
                cost = latency + handle.size_bytes * inverse_bandwidth
            if total is None:
                total = cost  # a fresh array; 0 + cost would be the same figures
            else:
                total += cost
        assert total is not None
        return total

    def _choose(
        self, task: StageTask, tables: StageTables, mask: np.ndarray
    ) -> tuple[int, dict[str, float]] | None:
        if not mask.any():
            return None
        compute = tables.next_compute if task.items == 1 else tables.next_compute * task.items
        transfer = self._transfer(task, tables)
        backlog = self._group_backlog() if self._grouped else self.backlog
        if self.placement == "round_robin":
            candidates = np.flatnonzero(mask)
            after = candidates[candidates > self._round_robin[task.stage]]
            index = int(after[0] if after.size else candidates[0])
            self._round_robin[task.stage] = index
        elif self.placement == "least_connections":
            index = int(np.argmin(np.where(mask, self.in_flight, np.iinfo(np.int64).max)))
        else:
            if self._unit_weights:
                total = backlog + tables.load_now + compute + transfer
            else:
                w = self.weights
                total = (
                    w.queue * backlog
                    + w.load * tables.load_now
                    + w.compute * compute
                    + w.transfer * transfer
                )
            total[~mask] = np.inf
            index = int(np.argmin(total))
        terms = {
            "queue": float(backlog[index]),
            "load": float(tables.load_now[index]),
            "compute": float(compute[index]),
            "transfer": float(transfer[index]),
        }
        return index, terms

    def _eligible(
        self, task: StageTask, costs: StageCosts, now: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Devices that may take ``task`` now (runnable, healthy, where its locality requires,
        breaker not open, not failed by it), and the breaker-blocked ones."""
        base = self._base_masks.get(costs.key)
        if base is None:
            base = costs.runnable & self.healthy
            if self._required[task.stage]:
                base &= self._local[task.stage]
            self._base_masks[costs.key] = base
        blocked = self._refresh_breakers(task.stage, now)
        mask = base & ~blocked if self._not_closed[task.stage] else base.copy()
        for device_id in task.excluded:
            index = self.fleet.index.get(device_id)
            if index is not None:
                mask[index] = False
        return mask, blocked

    def _why_not(self, task: StageTask, costs: StageCosts, blocked: np.ndarray) -> dict[str, str]:
        reasons = {}
        for index, device in enumerate(self.devices):
            misplaced = self._misplaced[task.stage][index]
            if costs.why_not[index]:
                reasons[device.id] = costs.why_not[index]
            elif misplaced and self._required[task.stage]:
                reasons[device.id] = misplaced
            elif not self.healthy[index]:
                reasons[device.id] = "unhealthy"
            elif blocked[index]:
                reasons[device.id] = "circuit breaker open"
            elif device.id in task.excluded:
                failure = task.failures.get(device.id, "")
                reasons[device.id] = (
                    f"failed this request ({failure})" if failure else "failed this request"
                )
        return reasons
