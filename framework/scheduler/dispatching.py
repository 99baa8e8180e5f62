"""The dispatch and completion loop: the highest-priority queued task placed on a device with
room for it (and the bookkeeping each placement makes), and a finished task's report freeing its
slot, correcting the stage's estimate and judging the device's breaker."""

from __future__ import annotations

import logging

import numpy as np

from hetero.framework.errors import NoEligibleDeviceError
from hetero.framework.scheduler.breakers import BreakerState, DeviceBreaker
from hetero.framework.scheduler.decisions import Dispatch, PlacementDecision, Rejection
from hetero.framework.scheduler.estimates import EstimatesMixin
from hetero.framework.scheduler.exploring import ExploringMixin
from hetero.framework.scheduler.memory import LoadPlan
from hetero.framework.scheduler.queues import StageQueue
from hetero.framework.scheduler.residency import ResidencyMixin
from hetero.framework.scheduler.tables import StageTables
from hetero.framework.scheduler.tasks import StageTask

__all__ = ["DispatchingMixin"]

logger = logging.getLogger(__name__)


def _log_decision(task: StageTask, decision: PlacementDecision) -> None:
    logger.debug(
        "task %d %s/%s -> %s: %.3g s (queue %.3g, load %.3g, compute %.3g, transfer %.3g)",
        task.id,
        task.stage,
        decision.variant,
        decision.device_id,
        decision.estimate_s,
        decision.queue_s,
        decision.load_s,
        decision.compute_s,
        decision.transfer_s,
    )


class DispatchingMixin(ResidencyMixin, EstimatesMixin, ExploringMixin):
    """Queued tasks taken to devices with room, and what their completions change."""

    def dispatch(self) -> Dispatch | Rejection | None:
        """Place the highest-priority task across all stages; None when nothing can go now."""
        now = self.clock.now()
        if now >= self._retry_blocked_at:
            self._unblock()
        if not self._queued.count:
            return None  # every queue empty: what the loop below would find, sooner
        while True:
            best: StageQueue | None = None
            best_key = -np.inf
            for name, queue in self.queues.items():
                if not queue.live or name in self._blocked_stages:
                    continue
                head_key = queue.head
                if head_key is not None and head_key > best_key:
                    best, best_key = queue, head_key
            if best is None:
                return None
            task = best.pop()
            assert task is not None
            outcome = self._place(task, now)
            if outcome is not None:
                if self._drains:
                    self._release_drains(task.id)
                return outcome
            best.push(task)  # same key: it keeps its place
            self._blocked_stages.add(best.stage)
            # Nothing completes to unblock it if the room is held by idle models still inside
            # their minimum residency: retry once the first of them may go, or once the task
            # is overdue and may evict them anyway.
            waits = [m.next_evictable(now) for m in self.memory]
            if self._bounded:
                waits.append(self.overdue_at(task))
            self._retry_blocked_at = min(
                [w for w in waits if w is not None and w > now] + [self._retry_blocked_at]
            )

    def _place(self, task: StageTask, now: float) -> Dispatch | Rejection | None:
        key = f"{task.stage}/{task.variant}"
        tables = self.tables.get(key) or self.tables[f"{task.stage}/full"]
        costs = tables.costs
        mask, blocked = self._eligible(task, costs, now)
        if not np.count_nonzero(mask):
            reasons = self._why_not(task, costs, blocked)
            return Rejection(task, NoEligibleDeviceError(task.stage, reasons))
        kv_bytes = self.kv_bytes(task, tables)
        found = self._room_for(task, tables, mask, now, kv_bytes)
        if found is None:
            return None  # every candidate is full of busy models: wait for room
        index, terms, plan = found
        if self._drains:
            self._end_drain(index)
        manager = self.memory[index]
        manager.kv_reserved += kv_bytes
        for victim in plan.evict:
            self.tables[victim].resident[index] = False
            self.tables[victim].refresh(index)
        resident_bytes = int(tables.resident_bytes[index])
        if plan.load or plan.evict:
            manager.apply(
                plan, resident_bytes, float(costs.load_s[index]), now, costs.min_residency_s
            )
        manager.begin(costs.key, now)
        tables.resident[index] = True
        breaker = self._breakers.get((task.stage, index))
        if breaker is not None:
            breaker.admit_probe()
        estimate = terms["load"] + terms["compute"] + terms["transfer"]
        tables.pending[index] += 1
        tables.refresh(index)
        self.in_flight[index] += 1
        queued_behind = self._backlog_share(tables, index, estimate)
        self.backlog[index] += queued_behind
        self._backlog_moved(index)
        device_id = self.devices[index].id
        decision = PlacementDecision(
            task_id=task.id,
            stage=task.stage,
            variant=costs.variant,
            device_id=device_id,
            policy=self.placement,
            estimate_s=terms["queue"] + estimate,
            queue_s=terms["queue"],
            load_s=terms["load"],
            compute_s=terms["compute"],
            transfer_s=terms["transfer"],
            candidates=int(np.count_nonzero(mask)),
        )
        self.decisions.append(decision)
        if logger.isEnabledFor(logging.DEBUG):
            _log_decision(task, decision)
        self.stats.counts["dispatches"] += 1
        if plan.load:
            self.stats.counts["loads"] += 1
        self.stats.counts["evictions"] += len(plan.evict)
        task.attempts += 1
        return Dispatch(
            task, device_id, costs.key, plan, decision, estimate, queued_behind, kv_bytes
        )

    def _room_for(
        self, task: StageTask, tables: StageTables, mask: np.ndarray, now: float, kv_bytes: int
    ) -> tuple[int, dict[str, float], LoadPlan] | None:
        """The device for ``task`` among the eligible ones in ``mask`` (narrowed in place to
        those with room) where its stage prefers first, the estimate's terms and what to load
        and evict there; None: it waits. While a runner-up runtime is being measured
        (:mod:`exploring`) it takes its compute resource's share of the model's tasks: those
        that would go to that resource, not those another resource's device wins."""
        self._with_room(tables, mask)
        trial = self._trial_mask(tables, mask) if self._trials and self._grouped else None
        if trial is not None:
            found = self._find_in(task, tables, trial, now, kv_bytes)
            if found is not None and self._trial_took(tables, found[0]):
                return found
            self._trial_passed(tables, trial, refused=found is None)
        return self._find_in(task, tables, mask, now, kv_bytes)

    def _find_in(
        self, task: StageTask, tables: StageTables, mask: np.ndarray, now: float, kv_bytes: int
    ) -> tuple[int, dict[str, float], LoadPlan] | None:
        """:meth:`_find_room` where the task's stage prefers first, then among ``mask``."""
        if task.stage in self._preferred:
            local = mask & self._local[task.stage]
            if np.count_nonzero(local):  # where the stage prefers
                found = self._find_room(task, tables, local, now, kv_bytes)
                if found is not None:
                    return found
        return self._find_room(task, tables, mask, now, kv_bytes)

    def _with_room(self, tables: StageTables, mask: np.ndarray) -> None:
        """Narrow ``mask`` (in place) to the devices with room for one more task of the
        model: at most one batch's worth outstanding per (model, device), and per (model,
        compute resource) where devices share one; the rest stays queued, where priority and
        aging decide what goes next. A model being drained for an overdue task gets no new
        work there."""
        mask &= tables.has_room  # pending < limit, kept by StageTables.refresh
        if self._grouped:
            mask &= self._group_room(tables)
        if self._drains:
            mask &= ~tables.draining

    def _group_room(self, tables: StageTables) -> np.ndarray:
        """Where the model may take one more task counting what every device of the same
        compute resource holds of it: runtimes over one CPU split its cores, so together
        they get the one batch (per run slot) a single device would, not one each."""
        groups = self._compute_group
        held = np.bincount(groups, weights=tables.pending, minlength=self._groups)[groups]
        room: np.ndarray = held < tables.limit
        return room

    def completed(
        self,
        dispatch: Dispatch,
        *,
        ok: bool,
        run_s: float,
        batch_size: int = 1,
        judge: bool = True,
        load_s: float = 0.0,
    ) -> None:
        """Report a dispatched task done (``run_s``: its batch's run time; ``load_s``: the
        model load it waited for, timed where it ran, 0 when resident). ``judge=False``
        frees its slot without telling the breaker or the estimate (a cancelled request)."""
        now = self.clock.now()
        index = self.fleet.index[dispatch.device_id]
        tables = self.tables[dispatch.model_key]
        tables.pending[index] = max(0, tables.pending[index] - 1)
        self.in_flight[index] = max(0, self.in_flight[index] - 1)
        self.backlog[index] = max(0.0, self.backlog[index] - dispatch.backlog_s)
        self._backlog_moved(index)
        manager = self.memory[index]
        manager.kv_reserved = max(0, manager.kv_reserved - dispatch.kv_bytes)
        manager.end(dispatch.model_key, now)
        if not judge:
            if self._grouped:  # a trial's task that ran nothing to judge still ended
                self._trial_finished(tables, index, None)
            tables.refresh(index)
            self._unblock()
            return
        if ok and load_s > 0:
            self.load_measured(dispatch.model_key, dispatch.device_id, load_s)
        if ok and run_s > 0:
            batches = tables.costs.batch_s[index]
            if isinstance(batch_size, int) and 1 <= batch_size < len(batches):  # batch_seconds
                modelled = batches[batch_size]
            else:
                device = self.devices[index]
                hint = tables.costs.hint
                modelled = hint.batch_seconds(
                    device.peak_flops_for(hint.dtype),
                    device.memory_bandwidth_bytes_per_s,
                    batch_size,
                )
            if modelled > 0:
                self._learn(tables, index, run_s / modelled, dispatch.task.items, batch_size)
        elif self._grouped:
            self._trial_finished(tables, index, None)
        tables.refresh(index)
        breaker = self.breaker(dispatch.task.stage, dispatch.device_id)
        before = breaker.state
        breaker.record(ok, run_s, now)
        if breaker.state is not BreakerState.CLOSED:
            self._not_closed[dispatch.task.stage].add(index)
        if breaker.state is not before:
            self.stats.counts[f"breaker_{breaker.state.value}"] += 1
        self._unblock()

    def _learn(
        self, tables: StageTables, index: int, ratio: float, items: int, batch_size: int
    ) -> None:
        """A task's batch ran ``ratio`` times the cost model's figure on device ``index``:
        move its correction (and its compute resource's, :meth:`_share_correction`), unless
        it was a trial of a runner-up runtime (:mod:`exploring`)."""
        if self._grouped and self._trial_finished(tables, index, ratio):
            return
        correction = tables.correction
        was = float(correction[index])
        correction[index] += self.smoothing * (ratio - correction[index])
        if self._grouped:
            if was > 0:
                self._share_correction(tables, index, float(correction[index]) / was)
            self._batch_counted(tables, index, items, batch_size, ratio)

    def _share_correction(self, tables: StageTables, index: int, factor: float) -> None:
        """Device ``index``'s measured runs moved its correction by ``factor``: move the
        other devices of its compute resource by as much. What slows a run on shared cores
        in service (the other models running beside it, the batch sizes the load makes) slows
        any runtime's run there, so their relative speed stays the one warm-up measured side
        by side (alone, under like conditions), and the level follows what service measures;
        otherwise an idle runtime's solo figure would win against the busy one's loaded figure
        and the stage would hop between runtimes, loading each."""
        if factor == 1.0:
            return
        group = self._compute_group
        for other in np.flatnonzero(group == group[index]).tolist():
            if other != index:
                tables.correction[other] *= factor
                tables.refresh(other)

    def breaker(self, stage: str, device_id: str) -> DeviceBreaker:
        """The failure breaker of (stage, device)."""
        index = self.fleet.index[device_id]
        key = (stage, index)
        if key not in self._breakers:
            config = self.policy.spec.circuit_breaker.device
            self._breakers[key] = DeviceBreaker(f"{stage}@{device_id}", config)
        return self._breakers[key]

    @property
    def next_retry_at(self) -> float:
        """When a stage blocked on memory should be tried again without any completion
        (infinity when none is waiting): event loops schedule a wake-up for it."""
        return float(self._retry_blocked_at)
