"""The scheduler: queues, placement, memory manager and failure breakers behind one object.

It knows devices and costs, never libraries: the engine (wall clock, real backends) and the
simulator (virtual clock, sim devices) drive the same object. A caller ``enqueue``\\ s stage
tasks, calls :meth:`Scheduler.dispatch` until it returns None, carries each
:class:`Dispatch` out (evict, load, run) and reports it with :meth:`Scheduler.completed`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hetero.framework.devices import DeviceClass, DeviceSpec
from hetero.framework.errors import HeteroError, NoEligibleDeviceError
from hetero.framework.graph import BandwidthHint
from hetero.framework.locality import locality_mismatch
from hetero.framework.plan import hint_from_variant
from hetero.framework.policy import Policy
from hetero.framework.scheduler.breakers import BreakerState, DeviceBreaker
from hetero.framework.scheduler.clock import Clock
from hetero.framework.scheduler.costs import FleetCosts, StageCosts
from hetero.framework.scheduler.memory import LoadPlan, MemoryManager
from hetero.framework.scheduler.queues import QueueClass, StageQueue
from hetero.framework.scheduler.tasks import StageTask
from hetero.framework.topology import Topology

__all__ = ["PLACEMENTS", "Dispatch", "PlacementDecision", "Rejection", "Scheduler"]

logger = logging.getLogger(__name__)

PLACEMENTS = ("cost_model", "round_robin", "least_connections")
DECISIONS_KEPT = 1024


@dataclass(frozen=True, slots=True)
class PlacementDecision:
    """Why a task went where it went: the estimate and its terms, in seconds."""

    task_id: int
    stage: str
    variant: str
    device_id: str
    policy: str
    estimate_s: float
    queue_s: float
    load_s: float
    compute_s: float
    transfer_s: float
    candidates: int


@dataclass(slots=True)
class Dispatch:
    """A placed task: evict ``load.evict``, load the model if ``load.load``, then run."""

    task: StageTask
    device_id: str
    model_key: str
    load: LoadPlan
    decision: PlacementDecision
    estimate_s: float
    backlog_s: float = 0.0  # what it added to its device's backlog (estimate / run slots)
    kv_bytes: int = 0
    """KV cache reserved on the device for this task, given back when it completes."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """A task that cannot run anywhere, with the error to report."""

    task: StageTask
    error: HeteroError


@dataclass(slots=True)
class _Tables:
    """Live per-device state of one (stage, variant), kept so a decision is a few vector ops."""

    costs: StageCosts
    pending: np.ndarray  # tasks dispatched to each device, not yet finished
    correction: np.ndarray  # measured over modelled, per device
    resident: np.ndarray
    load_now: np.ndarray  # load time if placed there now: 0 where resident
    next_compute: np.ndarray  # what one more item adds there now (batch slot x correction)
    limit: np.ndarray  # tasks that may be outstanding per device: a batch per run slot
    slots: np.ndarray  # batches a device runs at once (a task queues behind 1 / slots of it)
    resident_bytes: np.ndarray  # memory the model holds per device (an engine's KV cache too)
    draining: np.ndarray  # devices where this model gets no new work: an overdue task waits

    @classmethod
    def fresh(cls, costs: StageCosts, count: int) -> _Tables:
        return cls(
            costs=costs,
            pending=np.zeros(count, np.int64),
            correction=np.ones(count),
            resident=np.zeros(count, bool),
            load_now=costs.load_s.copy(),
            next_compute=costs.marginal_s[:, 0].copy(),
            limit=np.full(count, costs.hint.max_batch, np.int64),
            slots=np.ones(count, np.int64),
            resident_bytes=np.full(count, costs.hint.resident_bytes, np.int64),
            draining=np.zeros(count, bool),
        )

    def fit(self, index: int, slots: int, resident_bytes: int | None) -> None:
        """Device ``index`` runs ``slots`` batches at once and holds ``resident_bytes``."""
        self.limit[index] = self.costs.hint.max_batch * slots
        self.slots[index] = slots
        if resident_bytes is not None:
            self.resident_bytes[index] = resident_bytes

    def refresh(self, index: int) -> None:
        """Recompute one device's entries after its pending count, correction or residency moved."""
        slot = min(int(self.pending[index]), self.costs.hint.max_batch - 1)
        self.next_compute[index] = self.costs.marginal_s[index, slot] * self.correction[index]
        self.load_now[index] = 0.0 if self.resident[index] else self.costs.load_s[index]


@dataclass(slots=True)
class SchedulerStats:
    """Counters the engine and the simulator export."""

    counts: Counter[str] = field(default_factory=Counter)


def _always(stage: str, variant: str, device_id: str) -> bool:
    return True


def _compute_groups(devices: Sequence[DeviceSpec]) -> np.ndarray:
    """A group number per device: the CPU devices of one host (several runtimes over the same
    cores) share one; every other device is its own."""
    keys: dict[str, int] = {}
    out = np.zeros(len(devices), dtype=np.int64)
    for index, device in enumerate(devices):
        shared = device.device_class is DeviceClass.CPU and bool(
            device.properties.get("shares_host_memory", False)
        )
        key = f"cpu@{device.host}" if shared else f"device:{device.id}"
        out[index] = keys.setdefault(key, len(keys))
    return out


class Scheduler:
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
    ) -> None:
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
        self.memory = [
            MemoryManager(d.id, c, eviction) for d, c in zip(self.devices, capacity, strict=True)
        ]
        count = len(self.devices)
        self._can_run = can_run
        self.tables: dict[str, _Tables] = {}
        self._fits: dict[tuple[str, int], tuple[int, int | None]] = {}
        for name, stage in spec.stages.items():
            for variant_name, variant in stage.variants.items():
                # No figures in the policy: the stage plugin's hint arrives with set_hint();
                # until then the stage costs nothing (only its batch size is known).
                hint = hint_from_variant(variant) or BandwidthHint(
                    0.0, 0.0, batchable=variant.batchable, max_batch=variant.max_batch
                )
                costs = self._costs(name, variant_name, hint)
                self.tables[costs.key] = _Tables.fresh(costs, count)
        classes = {
            name: QueueClass(weight=c.weight, bound=c.queue_bound)
            for name, c in spec.qos.classes.items()
        }
        # Sorted: the policy's maps iterate in hash order, and dispatch breaks ties by this order.
        self.queues = {
            name: StageQueue(name, classes, spec.qos.aging_per_second)
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
        self.smoothing = spec.scheduler.measured_smoothing
        self.backlog = np.zeros(count)
        # Devices that are one host CPU seen through several runtimes (OpenVINO's CPU, ONNX
        # Runtime's CPU provider, torch on the CPU) share its cores: work promised to one of
        # them delays the others, so placement weighs their backlog together.
        self._compute_group = _compute_groups(self.devices)
        self._grouped = bool(len(set(self._compute_group.tolist())) < count)
        self.in_flight = np.zeros(count, np.int64)
        self.healthy = np.ones(count, bool)
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

    def _group_backlog(self) -> np.ndarray:
        """Each device's backlog summed over the devices that share its compute."""
        groups = self._compute_group
        summed: np.ndarray = np.bincount(groups, weights=self.backlog)[groups]
        return summed

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
        fresh = _Tables.fresh(self._costs(stage, variant, hint), len(self.devices))
        fresh.pending[:] = old.pending
        fresh.correction[:] = old.correction
        fresh.resident[:] = old.resident
        fresh.draining[:] = old.draining
        for index in range(len(self.devices)):
            fit = self._fits.get((stage, index))
            if fit is not None:
                fresh.fit(index, *fit)
            fresh.refresh(index)
        self.tables[key] = fresh
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
        for key, tables in list(self.tables.items()):
            stage, variant = key.split("/", 1)
            grown = _Tables.fresh(self._costs(stage, variant, tables.costs.hint), count)
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
        self._compute_group = _compute_groups(self.devices)
        self._grouped = bool(len(set(self._compute_group.tolist())) < count)
        self._base_masks.clear()
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
        for variant_name, variant in config.variants.items():
            hint = hint_from_variant(variant) or BandwidthHint(
                0.0, 0.0, batchable=variant.batchable, max_batch=variant.max_batch
            )
            costs = self._costs(name, variant_name, hint)
            self.tables[costs.key] = _Tables.fresh(costs, count)
        classes = {
            n: QueueClass(weight=c.weight, bound=c.queue_bound) for n, c in spec.qos.classes.items()
        }
        queues = {**self.queues, name: StageQueue(name, classes, spec.qos.aging_per_second)}
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

    def calibrate(self, stage: str, device_id: str, run_s: float, items: float = 1.0) -> None:
        """A measured run of ``items`` items of ``stage``'s full variant on ``device_id``
        (warm-up timing): every variant's estimate there is scaled to match it."""
        index = self.fleet.index[device_id]
        device = self.devices[index]
        full = self.tables[f"{stage}/full"].costs.hint
        modelled = full.batch_seconds(
            device.peak_flops_for(full.dtype), device.memory_bandwidth_bytes_per_s, items
        )
        if modelled <= 0 or run_s <= 0:
            return
        for key, tables in self.tables.items():
            if key.split("/", 1)[0] == stage:
                tables.correction[index] = run_s / modelled
                tables.refresh(index)

    def estimate_s(self, stage: str, variant: str, device_id: str, items: int = 1) -> float:
        """The calibrated compute estimate of ``items`` items on ``device_id`` (idle device)."""
        tables = self.tables.get(f"{stage}/{variant}") or self.tables[f"{stage}/full"]
        index = self.fleet.index[device_id]
        return float(tables.costs.marginal_s[index, 0] * tables.correction[index] * items)

    def fastest_s(self, stage: str, variant: str = "full") -> float:
        """The calibrated compute estimate of one item on the fastest device that can run the
        stage variant (infinity when none can)."""
        tables = self.tables.get(f"{stage}/{variant}") or self.tables[f"{stage}/full"]
        runnable = tables.costs.runnable & self.healthy
        if not runnable.any():
            return float("inf")
        times = tables.costs.marginal_s[runnable, 0] * tables.correction[runnable]
        return float(times.min())

    def runnable_devices(self, stage: str, variant: str = "full") -> list[str]:
        """Devices that could ever run this stage variant."""
        tables = self.tables.get(f"{stage}/{variant}") or self.tables[f"{stage}/full"]
        return [d.id for d, ok in zip(self.devices, tables.costs.runnable, strict=True) if ok]

    def run_slots(self, stage: str) -> int:
        """The most tasks of ``stage`` one healthy device runs at once (1 unless a device's
        runtime batches continuously): a queue of the stage drains that much faster."""
        tables = self.tables[f"{stage}/full"]
        runnable = tables.costs.runnable & self.healthy
        return int(tables.slots[runnable].max()) if runnable.any() else 1

    def queued(self, stage: str) -> int:
        """Tasks of ``stage`` waiting in its queue."""
        return len(self.queues[stage])

    def queued_items(self, stage: str) -> int:
        """Items of the tasks of ``stage`` waiting in its queue."""
        return self.queues[stage].items

    def queued_units(self, stage: str) -> float:
        """Complexity units of the tasks of ``stage`` waiting in its queue."""
        return max(0.0, self.queues[stage].units)

    # --- queues ------------------------------------------------------------------------------

    def enqueue(self, task: StageTask) -> None:
        """Queue a task (:class:`QueueFullError` sheds it)."""
        self.queues[task.stage].push(task)
        self._blocked_stages.discard(task.stage)
        if not self._blocked_stages:
            self._retry_blocked_at = np.inf

    def queue_delay_s(self) -> float:
        """The work already promised to devices, per device on average: admission's pressure."""
        live = self.healthy.sum()
        return float(self.backlog.sum() / live) if live else float("inf")

    def cancel(self, task: StageTask) -> None:
        """Drop a queued task (lazily)."""
        self.queues[task.stage].cancel(task)
        if self._drains:
            self._release_drains(task.id)

    # --- health and breakers -----------------------------------------------------------------

    def set_health(self, device_id: str, healthy: bool) -> None:
        """Take a device out of placement, or put it back."""
        self.healthy[self.fleet.index[device_id]] = healthy
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

    def _refresh_breakers(self, stage: str, now: float) -> np.ndarray:
        blocked = self._breaker_blocked[stage]
        for index in list(self._not_closed[stage]):
            breaker = self._breakers[(stage, index)]
            blocked[index] = not breaker.allows(now)
            if breaker.state is BreakerState.CLOSED:
                self._not_closed[stage].discard(index)
        return blocked

    # --- placement ---------------------------------------------------------------------------

    def _transfer(self, task: StageTask, tables: _Tables) -> np.ndarray:
        fleet = self.fleet
        if not task.inputs:
            size = tables.costs.hint.input_bytes * task.items
            return size * fleet.ingress_inverse_bandwidth
        if self.outputs_on_host:
            return sum(h.size_bytes for h in task.inputs) * fleet.ingress_inverse_bandwidth
        total = np.zeros(len(self.devices))
        for handle in task.inputs:
            src = fleet.index.get(handle.device_id)
            if src is None:
                # The device that holds the output is gone (unhealthy, removed): the engine
                # keeps outputs as host arrays, so it costs a host-to-device copy.
                total += handle.size_bytes * fleet.ingress_inverse_bandwidth
            else:
                latency, inverse_bandwidth = fleet.routes_from(src)
                total += latency + handle.size_bytes * inverse_bandwidth
        return total

    def _choose(
        self, task: StageTask, tables: _Tables, mask: np.ndarray
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

    def _place(self, task: StageTask, now: float) -> Dispatch | Rejection | None:
        key = f"{task.stage}/{task.variant}"
        tables = self.tables.get(key) or self.tables[f"{task.stage}/full"]
        costs = tables.costs
        mask, blocked = self._eligible(task, costs, now)
        if not mask.any():
            reasons = self._why_not(task, costs, blocked)
            return Rejection(task, NoEligibleDeviceError(task.stage, reasons))
        # At most one batch's worth outstanding per (model, device): the rest stays queued,
        # where priority and aging decide what goes next. A model being drained for an
        # overdue task gets no new work there.
        mask &= tables.pending < tables.limit
        if self._drains:
            mask &= ~tables.draining
        found = None
        if task.stage in self._preferred:
            local = mask & self._local[task.stage]
            if local.any():
                found = self._find_room(task, tables, local, now)  # where the stage prefers
        if found is None:
            found = self._find_room(task, tables, mask, now)
        if found is None:
            return None  # every candidate is full of busy models: wait for room
        index, terms, plan = found
        self._end_drain(index)
        manager = self.memory[index]
        kv_bytes = self.kv_bytes(task, tables)
        manager.kv_reserved += kv_bytes
        for victim in plan.evict:
            self.tables[victim].resident[index] = False
            self.tables[victim].refresh(index)
        resident_bytes = int(tables.resident_bytes[index])
        manager.apply(plan, resident_bytes, float(costs.load_s[index]), now, costs.min_residency_s)
        manager.begin(costs.key, now)
        tables.resident[index] = True
        breaker = self._breakers.get((task.stage, index))
        if breaker is not None:
            breaker.admit_probe()
        estimate = terms["load"] + terms["compute"] + terms["transfer"]
        tables.pending[index] += 1
        tables.refresh(index)
        self.in_flight[index] += 1
        queued_behind = estimate / float(tables.slots[index])
        self.backlog[index] += queued_behind
        decision = PlacementDecision(
            task_id=task.id,
            stage=task.stage,
            variant=costs.variant,
            device_id=self.devices[index].id,
            policy=self.placement,
            estimate_s=terms["queue"] + estimate,
            queue_s=terms["queue"],
            load_s=terms["load"],
            compute_s=terms["compute"],
            transfer_s=terms["transfer"],
            candidates=int(mask.sum()),
        )
        self.decisions.append(decision)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "task %d %s/%s -> %s: %.3g s (queue %.3g, load %.3g, compute %.3g, transfer %.3g)",
                task.id,
                task.stage,
                costs.variant,
                decision.device_id,
                decision.estimate_s,
                decision.queue_s,
                decision.load_s,
                decision.compute_s,
                decision.transfer_s,
            )
        self.stats.counts["dispatches"] += 1
        if plan.load:
            self.stats.counts["loads"] += 1
        self.stats.counts["evictions"] += len(plan.evict)
        task.attempts += 1
        device_id = self.devices[index].id
        return Dispatch(
            task, device_id, costs.key, plan, decision, estimate, queued_behind, kv_bytes
        )

    def kv_bytes(self, task: StageTask, tables: _Tables) -> int:
        """The KV cache ``task`` holds at its longest, in whole blocks of the paged allocator
        (its last block partly empty: the internal fragmentation a block size costs)."""
        per_token = tables.costs.hint.kv_bytes_per_token
        if not task.kv_tokens or not per_token:
            return 0
        block = self.kv_block_tokens
        blocks = -(-task.kv_tokens // block)
        return int(blocks * block * per_token)

    def _find_room(
        self, task: StageTask, tables: _Tables, mask: np.ndarray, now: float
    ) -> tuple[int, dict[str, float], LoadPlan] | None:
        """The best device that can make the model resident, and how.

        Minimum residency stops thrash, but must not starve a model with no replica free to
        take the task (none at all, or every one at its batch limit): then a second pass may
        evict young idle models that have another replica elsewhere (never the last copy of a
        model, which would only move the thrash).
        """
        costs = tables.costs
        kv_bytes = self.kv_bytes(task, tables)
        passes = [frozenset[str]()]
        if not (tables.resident & mask).any():
            passes.append(frozenset(k for k, t in self.tables.items() if t.resident.sum() >= 2))
        overdue = self._bounded and self.overdue(task, now)
        for allow_young in passes:
            candidates = mask.copy()
            while (chosen := self._choose(task, tables, candidates)) is not None:
                index, terms = chosen
                plan = self.memory[index].plan(
                    costs.key,
                    int(tables.resident_bytes[index]),
                    now,
                    allow_young=allow_young,
                    overdue=overdue,
                    kv_bytes=kv_bytes,
                )
                if plan is not None:
                    return index, terms, plan
                candidates[index] = False
        if overdue:
            self._start_drain(task, tables, mask, now, kv_bytes)
        return None

    def overdue(self, task: StageTask, now: float) -> bool:
        """Whether ``task`` has waited its class's ``max_load_wait_s`` in its queue: from then
        on minimum residency no longer protects other models from it."""
        return now >= self.overdue_at(task)

    def overdue_at(self, task: StageTask) -> float:
        """When ``task`` becomes overdue (the same sum as the wake-up time, so a wake-up at
        that instant finds it overdue whatever the rounding)."""
        return task.enqueued_at + self.load_wait_s[task.qos_class]

    def _start_drain(
        self, task: StageTask, tables: _Tables, mask: np.ndarray, now: float, kv_bytes: int
    ) -> None:
        """Busy models hold the room an overdue task needs: on the best device without a drain
        under way, stop feeding the models whose going makes room, so they turn idle within
        the work already promised to them (at most one batch each)."""
        if any(owner == task.id for owner, _ in self._drains.values()):
            return
        candidates = mask.copy()
        for index in self._drains:
            candidates[index] = False
        costs = tables.costs
        while (chosen := self._choose(task, tables, candidates)) is not None:
            index = chosen[0]
            manager = self.memory[index]
            resident = costs.key in manager.resident
            needed = kv_bytes + (0 if resident else costs.hint.resident_bytes)
            victims = manager.drain_victims(needed, now, keep=costs.key)
            if victims is not None:
                self._drains[index] = (task.id, victims)
                for victim in victims:
                    self.tables[victim].draining[index] = True
                self.stats.counts["drains"] += 1
                return
            candidates[index] = False

    def _end_drain(self, index: int) -> None:
        drain = self._drains.pop(index, None)
        if drain is not None:
            for victim in drain[1]:
                self.tables[victim].draining[index] = False
            self._unblock()  # the next overdue task may start its drain at once

    def _release_drains(self, task_id: int) -> None:
        """The task a drain was for left the queue (placed, rejected, cancelled)."""
        for index, (owner, _) in list(self._drains.items()):
            if owner == task_id:
                self._end_drain(index)

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

    def dispatch(self) -> Dispatch | Rejection | None:
        """Place the highest-priority task across all stages; None when nothing can go now."""
        now = self.clock.now()
        if now >= self._retry_blocked_at:
            self._unblock()
        while True:
            best: StageQueue | None = None
            best_key = -np.inf
            for name, queue in self.queues.items():
                if name in self._blocked_stages:
                    continue
                head_key = queue.peek_key()
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

    # --- completion --------------------------------------------------------------------------

    def completed(
        self,
        dispatch: Dispatch,
        *,
        ok: bool,
        run_s: float,
        batch_size: int = 1,
        judge: bool = True,
    ) -> None:
        """Report a dispatched task done (``run_s``: its batch's run time). ``judge=False``
        frees its slot without telling the breaker or the estimate (a cancelled request)."""
        now = self.clock.now()
        index = self.fleet.index[dispatch.device_id]
        tables = self.tables[dispatch.model_key]
        tables.pending[index] = max(0, tables.pending[index] - 1)
        self.in_flight[index] = max(0, self.in_flight[index] - 1)
        self.backlog[index] = max(0.0, self.backlog[index] - dispatch.backlog_s)
        manager = self.memory[index]
        manager.kv_reserved = max(0, manager.kv_reserved - dispatch.kv_bytes)
        manager.end(dispatch.model_key, now)
        if not judge:
            tables.refresh(index)
            self._unblock()
            return
        if ok and run_s > 0:
            device = self.devices[index]
            hint = tables.costs.hint
            modelled = hint.batch_seconds(
                device.peak_flops_for(hint.dtype), device.memory_bandwidth_bytes_per_s, batch_size
            )
            if modelled > 0:
                ratio = run_s / modelled
                correction = tables.correction
                correction[index] += self.smoothing * (ratio - correction[index])
        tables.refresh(index)
        breaker = self.breaker(dispatch.task.stage, dispatch.device_id)
        before = breaker.state
        breaker.record(ok, run_s, now)
        if breaker.state is not BreakerState.CLOSED:
            self._not_closed[dispatch.task.stage].add(index)
        if breaker.state is not before:
            self.stats.counts[f"breaker_{breaker.state.value}"] += 1
        self._unblock()

    def preload(self, device_id: str, model_key: str) -> bool:
        """Make ``model_key`` resident on ``device_id`` before any work (a warm start). False if
        it does not fit in the free memory: a warm start never evicts."""
        index = self.fleet.index[device_id]
        tables = self.tables[model_key]
        costs = tables.costs
        now = self.clock.now()
        resident_bytes = int(tables.resident_bytes[index])
        plan = self.memory[index].plan(model_key, resident_bytes, now)
        if plan is None or plan.evict:
            return plan is not None and not plan.load
        self.memory[index].apply(
            plan, resident_bytes, float(costs.load_s[index]), now, costs.min_residency_s
        )
        tables.resident[index] = True
        tables.refresh(index)
        return True

    def prefetch(self, model_key: str, evictable: frozenset[str]) -> tuple[str, LoadPlan] | None:
        """Load ``model_key`` ahead of its traffic (predictive warm-up) on the device where it
        loads fastest and room can be made by evicting idle models named in ``evictable`` (even
        young ones: the forecaster judged them colder). None when no device has such room or
        it is already resident somewhere. The caller carries out the plan (the load takes its
        time on the device)."""
        tables = self.tables[model_key]
        costs = tables.costs
        if tables.resident.any():
            return None
        now = self.clock.now()
        runnable = np.flatnonzero(costs.runnable & self.healthy)
        for index in sorted(runnable.tolist(), key=lambda i: (float(costs.load_s[i]), i)):
            manager = self.memory[index]
            plan = manager.plan(model_key, costs.hint.resident_bytes, now, allow_young=evictable)
            if plan is None or not all(victim in evictable for victim in plan.evict):
                continue
            for victim in plan.evict:
                self.tables[victim].resident[index] = False
                self.tables[victim].refresh(index)
            manager.apply(
                plan,
                costs.hint.resident_bytes,
                float(costs.load_s[index]),
                now,
                costs.min_residency_s,
            )
            tables.resident[index] = True
            tables.refresh(index)
            self.stats.counts["loads"] += 1
            self.stats.counts["prefetches"] += 1
            self.stats.counts["evictions"] += len(plan.evict)
            return self.devices[index].id, plan
        return None

    def release(self, device_id: str, model_key: str) -> bool:
        """Evict an idle ``model_key`` from ``device_id`` (its traffic is forecast to have
        ended); False if it is not resident there or has work in flight."""
        index = self.fleet.index[device_id]
        manager = self.memory[index]
        residency = manager.resident.get(model_key)
        if residency is None or residency.in_flight:
            return False
        now = self.clock.now()
        manager.apply(LoadPlan(key=model_key, load=False, evict=(model_key,)), 0, 0.0, now, 0.0)
        self.tables[model_key].resident[index] = False
        self.tables[model_key].refresh(index)
        self.stats.counts["evictions"] += 1
        self.stats.counts["releases"] += 1
        self._unblock()
        return True

    def _unblock(self) -> None:
        """Something changed (a completion, health): every blocked stage may try again."""
        self._blocked_stages.clear()
        self._retry_blocked_at = np.inf

    @property
    def next_retry_at(self) -> float:
        """When a stage blocked on memory should be tried again without any completion
        (infinity when none is waiting): event loops schedule a wake-up for it."""
        return float(self._retry_blocked_at)

    def batching_for(self, model_key: str) -> tuple[int, float]:
        """``(max_batch, max_delay_s)`` of a stage variant: its own figures, else the
        scheduler's default delay; 1 for a variant that is not batchable."""
        hint = self.tables[model_key].costs.hint
        stage_name, variant_name = model_key.split("/", 1)
        variants = self.policy.spec.stages[stage_name].variants
        variant = variants["light"] if variant_name == "light" else variants["full"]
        delay_ms = variant.max_delay_ms
        if delay_ms is None:
            delay_ms = self.policy.spec.scheduler.batching.max_delay_ms
        return (hint.max_batch if hint.batchable else 1), delay_ms / 1000.0

    def eligible_devices(self, stage: str, variant: str) -> int:
        """How many devices could ever run this stage variant (healthy or not)."""
        tables = self.tables.get(f"{stage}/{variant}") or self.tables[f"{stage}/full"]
        return int(tables.costs.runnable.sum())

    def unloaded(self, device_id: str, model_key: str) -> None:
        """The engine dropped a model on its own (a failed load): forget its residency."""
        index = self.fleet.index[device_id]
        self.memory[index].resident.pop(model_key, None)
        self.tables[model_key].resident[index] = False
        self.tables[model_key].refresh(index)
