"""The scheduler: queues, placement, memory manager and failure breakers behind one object.

This file holds the object, its fleet updates, queues, health and the dispatch and completion
loop; its parts live beside it: :mod:`placement` (which device), :mod:`residency` (room for
the model, drains, warm starts), :mod:`estimates` (what the tables say), :mod:`tables` (live
per-device arrays), :mod:`decisions` (what callers receive), :mod:`state` (the shared fields).

It knows devices and costs, never libraries: the engine (wall clock, real backends) and the
simulator (virtual clock, sim devices) drive the same object. A caller ``enqueue``\\ s stage
tasks, calls :meth:`Scheduler.dispatch` until it returns None, carries each
:class:`Dispatch` out (evict, load, run) and reports it with :meth:`Scheduler.completed`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from hetero.framework.devices import DeviceSpec
from hetero.framework.errors import NoEligibleDeviceError
from hetero.framework.graph import BandwidthHint
from hetero.framework.locality import locality_mismatch
from hetero.framework.policy import Policy
from hetero.framework.policy.hints import hint_from_variant
from hetero.framework.policy.schema import StageConfig
from hetero.framework.scheduler import placement as placement_module
from hetero.framework.scheduler.breakers import BreakerState, DeviceBreaker
from hetero.framework.scheduler.clock import Clock
from hetero.framework.scheduler.costs import FleetCosts, StageCosts
from hetero.framework.scheduler.decisions import (
    Dispatch,
    PlacementDecision,
    Rejection,
    SchedulerStats,
)
from hetero.framework.scheduler.estimates import EstimatesMixin
from hetero.framework.scheduler.exploring import ExploringMixin
from hetero.framework.scheduler.memory import LoadPlan, MemoryManager, share_memory
from hetero.framework.scheduler.output_lengths import OutputLengths
from hetero.framework.scheduler.queues import LiveTally, QueueClass, StageQueue
from hetero.framework.scheduler.residency import ResidencyMixin
from hetero.framework.scheduler.tables import StageTables, compute_groups
from hetero.framework.scheduler.tasks import StageTask
from hetero.framework.topology import Topology

__all__ = [
    "PLACEMENTS",
    "Dispatch",
    "PlacementDecision",
    "Rejection",
    "Scheduler",
    "SchedulerStats",
]

logger = logging.getLogger(__name__)

PLACEMENTS = ("cost_model", "round_robin", "least_connections", "power_of_two", "pinned_fastest")
SEARCHES = (None, "full", "bounded")
DECISIONS_KEPT = 1024


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


def _always(stage: str, variant: str, device_id: str) -> bool:
    return True


class Scheduler(ResidencyMixin, EstimatesMixin, ExploringMixin):
    """Queues per stage, cost-model placement, memory and breakers for one fleet."""

    def __init__(
        self,
        policy: Policy,
        devices: Sequence[DeviceSpec],
        topology: Topology,
        clock: Clock,
        *,
        placement: str | None = None,
        can_run: Callable[[str, str, str], bool] = _always,
        outputs_on_host: bool = False,
        eviction: str = "cost_aware",
        search: str | None = None,
    ) -> None:
        """``search``: ``"full"`` costs every device per decision, ``"bounded"`` searches
        hosts by branch and bound (the same answer); None: bounded from
        :data:`~hetero.framework.scheduler.placement.BOUNDED_SEARCH_MIN_DEVICES` devices."""
        spec = policy.spec
        self.policy = policy
        self.clock = clock
        self.placement = placement or spec.scheduler.placement
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"unknown placement {self.placement!r} (known: {', '.join(PLACEMENTS)})"
            )
        self.devices = tuple(devices)
        reserve = spec.scheduler.memory_reserve_fraction
        capacity = [int(d.memory_bytes * (1 - reserve)) for d in self.devices]
        self.fleet = FleetCosts(self.devices, topology, capacity)
        self.memory = share_memory(
            [MemoryManager(d.id, c, eviction) for d, c in zip(self.devices, capacity, strict=True)],
            [d.memory_id for d in self.devices],
        )
        count = len(self.devices)
        self._can_run = can_run
        self.tables: dict[str, StageTables] = {}
        self.output_lengths = OutputLengths()  # generations' expected output, learnt
        self._fits: dict[tuple[str, int], tuple[int, int | None]] = {}
        for name, stage in spec.stages.items():
            self._add_tables(name, stage, count)
        self._index_kv_tables()
        classes = {
            name: QueueClass(weight=c.weight, bound=c.queue_bound)
            for name, c in spec.qos.classes.items()
        }
        # Sorted: the policy's maps iterate in hash order, and dispatch breaks ties by this order.
        self._queued = LiveTally()  # live tasks over every stage's queue
        self.queues = {
            name: StageQueue(name, classes, spec.qos.aging_per_second, self._queued)
            for name in sorted(spec.stages)
        }
        # How long a class's task waits for room before minimum residency stops protecting
        # other models; plain LRU (the comparison baseline) has no residency to override.
        self.load_wait_s = {
            name: c.max_load_wait_s or spec.scheduler.max_load_wait_s
            for name, c in spec.qos.classes.items()
        }
        # Data locality per stage: which devices match, and whether that is required.
        self._misplaced = {
            name: [locality_mismatch(stage.locality, d) for d in self.devices]
            for name, stage in spec.stages.items()
        }
        self._local = {
            name: np.array([not reason for reason in reasons], bool)
            for name, reasons in self._misplaced.items()
        }
        self._required = {
            name: stage.locality is not None and stage.locality.mode == "require"
            for name, stage in spec.stages.items()
        }
        self._preferred = {
            name
            for name, stage in spec.stages.items()
            if stage.locality is not None and stage.locality.mode == "prefer"
        }
        self._bounded = eviction != "lru"
        self.kv_block_tokens = spec.scheduler.kv_block_tokens
        self._drains: dict[int, tuple[int, tuple[str, ...]]] = {}
        self.weights = spec.scheduler.weights
        w = self.weights
        self._unit_weights = (w.queue, w.load, w.compute, w.transfer) == (1.0, 1.0, 1.0, 1.0)
        self._base_masks: dict[str, np.ndarray] = {}
        self._fleet_searched(search)
        self.smoothing = spec.scheduler.measured_smoothing
        self._fleet_arrays(count)
        self._init_exploring()
        self._loads = {}
        self._breakers: dict[tuple[str, int], DeviceBreaker] = {}
        self._breaker_blocked = {name: np.zeros(count, bool) for name in spec.stages}
        self._not_closed: dict[str, set[int]] = {name: set() for name in spec.stages}
        self._round_robin = dict.fromkeys(spec.stages, -1)
        self._blocked_stages: set[str] = set()
        self.decisions: deque[PlacementDecision] = deque(maxlen=DECISIONS_KEPT)
        self.stats = SchedulerStats()
        # The engine keeps stage outputs as host arrays, so every input is a host-to-device
        # copy; the simulator models outputs staying on their device.
        self.outputs_on_host = outputs_on_host
        self._retry_blocked_at = np.inf
        # residency: when each device was last given a KV model's sequence or another
        # stage's task (continuous LLM spread), and the pace of a KV model's sequences
        self._spread_placed_at, self._kv_pace = {}, {}
        self._kv_device_figures = {}  # per KV model: its pace and the inverse bandwidths

    def _fleet_arrays(self, count: int) -> None:
        """Per device: the work promised to it, its tasks in flight, its health, and its
        compute resource. Devices that draw on one compute resource (one host CPU seen
        through several runtimes: OpenVINO's CPU, ONNX Runtime's CPU provider, torch on the
        CPU) share it: work promised to one of them delays the others, so placement weighs
        their backlog together, and they hold one batch of a model between them
        (:meth:`_group_room`)."""
        self.backlog = np.zeros(count)
        self.in_flight = np.zeros(count, np.int64)
        self.healthy = np.ones(count, bool)
        self._set_compute_groups()

    def _set_compute_groups(self) -> None:
        """Number each device's compute resource (:func:`compute_groups`)."""
        self._compute_group = compute_groups(self.devices)
        self._groups = int(self._compute_group.max()) + 1 if len(self.devices) else 0
        self._grouped = self._groups < len(self.devices)

    def shares_compute(self, device_a: str, device_b: str) -> bool:
        """Whether two devices draw on one compute resource (:attr:`DeviceSpec.compute_id`)."""
        index = self.fleet.index
        return bool(self._compute_group[index[device_a]] == self._compute_group[index[device_b]])

    def _group_room(self, tables: StageTables) -> np.ndarray:
        """Where the model may take one more task counting what every device of the same
        compute resource holds of it: runtimes over one CPU split its cores, so together
        they get the one batch (per run slot) a single device would, not one each."""
        groups = self._compute_group
        held = np.bincount(groups, weights=tables.pending, minlength=self._groups)[groups]
        room: np.ndarray = held < tables.limit
        return room

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

    def _fleet_searched(self, search: str | None) -> None:
        """Whether placement searches by branch and bound on this fleet (one host: no)."""
        if search not in SEARCHES:
            raise ValueError(f"unknown search {search!r} (known: full, bounded)")
        self._search = search
        count = len(self.devices)
        large = count >= placement_module.BOUNDED_SEARCH_MIN_DEVICES
        chosen = search == "bounded" or (search is None and large)
        self._bounded_search = chosen and self.placement == "cost_model" and self.fleet.hosts > 1

    def _add_tables(self, name: str, stage: StageConfig, count: int) -> None:
        """Fresh tables for each variant of stage ``name``. A variant without figures in the
        policy costs nothing until the stage plugin's hint arrives with set_hint() (only its
        batch size is known)."""
        for variant_name, variant in stage.variants.items():
            hint = hint_from_variant(variant) or BandwidthHint(
                0.0, 0.0, batchable=variant.batchable, max_batch=variant.max_batch
            )
            costs = self._costs(name, variant_name, hint)
            self.tables[costs.key] = StageTables.fresh(
                costs, count, self._ahead_s(name, variant_name)
            )

    def _ahead_s(self, stage: str, variant: str) -> float | None:
        """The variant's ``dispatch_ahead_ms``, else the policy-wide one, in seconds (None:
        a device takes up to a batch per run slot). None for a variant batched continuously
        (a KV cache under ``batching.llm: continuous``): a task joins the running batch at its
        next step, so nothing waits behind a batch, and a sequence's whole decode would
        exceed any useful bound."""
        spec = self.policy.spec
        variants = spec.stages[stage].variants
        config = variants["light"] if variant == "light" else variants["full"]
        if config.kv_bytes_per_token and spec.scheduler.batching.llm == "continuous":
            return None
        ahead_ms = config.dispatch_ahead_ms
        if ahead_ms is None:
            ahead_ms = spec.scheduler.batching.dispatch_ahead_ms
        return None if ahead_ms is None else ahead_ms / 1000.0

    def _costs(self, stage: str, variant: str, hint: BandwidthHint) -> StageCosts:
        config = self.policy.spec.stages[stage]
        residency = config.min_residency_s
        if residency is None:
            residency = self.policy.spec.scheduler.min_residency_s
        return self.fleet.stage(
            stage, variant, hint, config.device_classes, residency, self._can_run
        )

    def set_hint(self, stage: str, variant: str, hint: BandwidthHint) -> None:
        """Cost ``stage/variant`` by ``hint`` from now on (a stage plugin's graphs are the
        source of its cost); the policy's batch size and delay still bound its batches."""
        key = f"{stage}/{variant}"
        old = self.tables[key]
        policy_batch = old.costs.hint.max_batch
        if hint.batchable:
            hint = dataclasses.replace(hint, max_batch=min(hint.max_batch, policy_batch))
        fresh = StageTables.fresh(
            self._costs(stage, variant, hint), len(self.devices), self._ahead_s(stage, variant)
        )
        fresh.pending[:] = old.pending
        for (measured_key, index), seconds in self._loads.items():
            if measured_key == key:  # a load timed where it ran outlives the hint's guess
                fresh.costs.load_s[index] = seconds
        fresh.correction[:] = old.correction
        fresh.resident[:] = old.resident
        fresh.draining[:] = old.draining
        for index in range(len(self.devices)):
            fit = self._fits.get((stage, index))
            if fit is not None:
                fresh.fit(index, *fit)
            fresh.refresh(index)
        self.tables[key] = fresh
        self._index_kv_tables()
        self._base_masks.clear()

    def set_device_fit(
        self, stage: str, device_id: str, *, slots: int = 1, resident_bytes: int | None = None
    ) -> None:
        """How ``stage`` runs on ``device_id`` when its runtime there differs from the hint:
        ``slots`` batches at once (a vLLM engine's continuous batching: that many tasks may
        be outstanding, and each queues behind the others for a share of its estimate) and
        ``resident_bytes`` held (the engine's KV cache beside its weights), which the memory
        manager plans with. Kept across :meth:`set_hint`."""
        if slots < 1:
            raise ValueError(f"slots must be a positive integer, got {slots}")
        index = self.fleet.index[device_id]
        self._fits[(stage, index)] = (slots, resident_bytes)
        for key, tables in self.tables.items():
            if key.split("/", 1)[0] == stage:
                tables.fit(index, slots, resident_bytes)

    def add_devices(self, devices: Sequence[DeviceSpec], topology: Topology) -> None:
        """Take in devices that joined (a cluster node): they are placed on from now on, with
        nothing resident; what the others hold, their queues and estimates stay as they are.
        ``topology`` is the model of the whole fleet, old devices and new."""
        if not devices:
            return
        old = len(self.devices)
        self.devices = self.devices + tuple(devices)
        count = len(self.devices)
        reserve = self.policy.spec.scheduler.memory_reserve_fraction
        capacity = [int(d.memory_bytes * (1 - reserve)) for d in self.devices]
        self.fleet = FleetCosts(self.devices, topology, capacity)
        eviction = self.memory[0].eviction if self.memory else "cost_aware"
        self.memory.extend(
            MemoryManager(d.id, c, eviction) for d, c in zip(devices, capacity[old:], strict=True)
        )
        share_memory(self.memory, [d.memory_id for d in self.devices])
        for key, tables in list(self.tables.items()):
            stage, variant = key.split("/", 1)
            costs = self._costs(stage, variant, tables.costs.hint)
            grown = StageTables.fresh(costs, count, tables.ahead_s)
            grown.pending[:old] = tables.pending
            grown.correction[:old] = tables.correction
            grown.resident[:old] = tables.resident
            grown.draining[:old] = tables.draining
            for index in range(old):
                fit = self._fits.get((stage, index))
                if fit is not None:
                    grown.fit(index, *fit)
                grown.refresh(index)
            self.tables[key] = grown
        self._index_kv_tables()
        spec = self.policy.spec
        for name, stage_config in spec.stages.items():  # the newcomers' data locality
            reasons = [locality_mismatch(stage_config.locality, d) for d in devices]
            self._misplaced[name] = self._misplaced[name] + reasons
            self._local[name] = np.concatenate(
                [self._local[name], np.array([not reason for reason in reasons], bool)]
            )
        extra = count - old
        self.backlog = np.concatenate([self.backlog, np.zeros(extra)])
        self.in_flight = np.concatenate([self.in_flight, np.zeros(extra, np.int64)])
        self.healthy = np.concatenate([self.healthy, np.ones(extra, bool)])
        self._breaker_blocked = {
            name: np.concatenate([blocked, np.zeros(extra, bool)])
            for name, blocked in self._breaker_blocked.items()
        }
        self._set_compute_groups()
        self._base_masks.clear()
        self._fleet_searched(self._search)
        self._unblock()

    def add_stage(self, name: str, policy: Policy) -> None:
        """Take in a stage that ``policy`` (the running one plus it) adds: a model version
        loaded beside the one serving. It starts costed by its policy figures, with its own
        queue, residency and breakers; nothing else changes."""
        if name in self.queues:
            raise ValueError(f"stage {name!r} is already scheduled")
        self.policy = policy
        spec = policy.spec
        config = spec.stages[name]
        count = len(self.devices)
        self._add_tables(name, config, count)
        self._index_kv_tables()
        classes = {
            n: QueueClass(weight=c.weight, bound=c.queue_bound) for n, c in spec.qos.classes.items()
        }
        queue = StageQueue(name, classes, spec.qos.aging_per_second, self._queued)
        queues = {**self.queues, name: queue}
        self.queues = dict(sorted(queues.items()))  # dispatch breaks ties by this order
        self._misplaced[name] = [locality_mismatch(config.locality, d) for d in self.devices]
        self._local[name] = np.array([not reason for reason in self._misplaced[name]], bool)
        self._required[name] = config.locality is not None and config.locality.mode == "require"
        if config.locality is not None and config.locality.mode == "prefer":
            self._preferred.add(name)
        self._breaker_blocked[name] = np.zeros(count, bool)
        self._not_closed[name] = set()
        self._round_robin[name] = -1
        self._base_masks.clear()

    def queued(self, stage: str) -> int:
        """Tasks of ``stage`` waiting in its queue."""
        return len(self.queues[stage])

    def queued_items(self, stage: str) -> int:
        """Items of the tasks of ``stage`` waiting in its queue."""
        return self.queues[stage].items

    def queued_units(self, stage: str) -> float:
        """Complexity units of the tasks of ``stage`` waiting in its queue."""
        return max(0.0, self.queues[stage].units)

    def enqueue(self, task: StageTask) -> None:
        """Queue a task (:class:`QueueFullError` sheds it)."""
        self.queues[task.stage].push(task)
        self._blocked_stages.discard(task.stage)
        if not self._blocked_stages:
            self._retry_blocked_at = np.inf

    def cancel(self, task: StageTask) -> None:
        """Drop a queued task (lazily)."""
        self.queues[task.stage].cancel(task)
        if self._drains:
            self._release_drains(task.id)

    def set_health(self, device_id: str, healthy: bool) -> None:
        """Take a device out of placement, or put it back."""
        self.healthy[self.fleet.index[device_id]] = healthy
        for tables in self.tables.values():
            tables.fastest_s = None
        self._unblock()
        self._base_masks.clear()

    def breaker(self, stage: str, device_id: str) -> DeviceBreaker:
        """The failure breaker of (stage, device)."""
        index = self.fleet.index[device_id]
        key = (stage, index)
        if key not in self._breakers:
            config = self.policy.spec.circuit_breaker.device
            self._breakers[key] = DeviceBreaker(f"{stage}@{device_id}", config)
        return self._breakers[key]

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
            self._batch_counted(tables, index, items, batch_size)

    @property
    def next_retry_at(self) -> float:
        """When a stage blocked on memory should be tried again without any completion
        (infinity when none is waiting): event loops schedule a wake-up for it."""
        return float(self._retry_blocked_at)
