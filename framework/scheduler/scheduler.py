"""The scheduler: queues, placement, memory manager and failure breakers behind one object.

This file holds the object, its construction, queues and health; its parts live beside it:
:mod:`dispatching` (the dispatch and completion loop), :mod:`fleet_updates` (hints, device
fits, devices and stages added), :mod:`placement` (which device), :mod:`residency` (room for
the model, drains, warm starts), :mod:`estimates` (what the tables say), :mod:`tables` (live
per-device arrays), :mod:`decisions` (what callers receive), :mod:`state` (the shared fields).

It knows devices and costs, never libraries: the engine (wall clock, real backends) and the
simulator (virtual clock, sim devices) drive the same object. A caller ``enqueue``\\ s stage
tasks, calls :meth:`Scheduler.dispatch` until it returns None, carries each
:class:`Dispatch` out (evict, load, run) and reports it with :meth:`Scheduler.completed`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from hetero.framework.devices import DeviceSpec
from hetero.framework.locality import locality_mismatch
from hetero.framework.policy import Policy
from hetero.framework.scheduler.breakers import DeviceBreaker
from hetero.framework.scheduler.clock import Clock
from hetero.framework.scheduler.costs import FleetCosts
from hetero.framework.scheduler.decisions import (
    Dispatch,
    PlacementDecision,
    Rejection,
    SchedulerStats,
)
from hetero.framework.scheduler.dispatching import DispatchingMixin
from hetero.framework.scheduler.fleet_updates import FleetUpdatesMixin
from hetero.framework.scheduler.memory import MemoryManager, share_memory
from hetero.framework.scheduler.output_lengths import OutputLengths
from hetero.framework.scheduler.queues import LiveTally, QueueClass, StageQueue
from hetero.framework.scheduler.tables import StageTables
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

PLACEMENTS = ("cost_model", "round_robin", "least_connections", "power_of_two", "pinned_fastest")
DECISIONS_KEPT = 1024


def _always(stage: str, variant: str, device_id: str) -> bool:
    return True


class Scheduler(DispatchingMixin, FleetUpdatesMixin):
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

    def shares_compute(self, device_a: str, device_b: str) -> bool:
        """Whether two devices draw on one compute resource (:attr:`DeviceSpec.compute_id`)."""
        index = self.fleet.index
        return bool(self._compute_group[index[device_a]] == self._compute_group[index[device_b]])

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
