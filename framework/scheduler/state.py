"""The state the scheduler's parts share (placement, residency, estimates, dispatch), declared
once so each part's file type-checks on its own; :class:`Scheduler` sets every field."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from hetero.framework.devices import DeviceSpec
from hetero.framework.graph import BandwidthHint
from hetero.framework.policy import Policy
from hetero.framework.policy.schema import PlacementWeights
from hetero.framework.scheduler.breakers import DeviceBreaker
from hetero.framework.scheduler.clock import Clock
from hetero.framework.scheduler.costs import FleetCosts
from hetero.framework.scheduler.decisions import PlacementDecision, SchedulerStats
from hetero.framework.scheduler.memory import MemoryManager
from hetero.framework.scheduler.queues import LiveTally, StageQueue
from hetero.framework.scheduler.tables import StageTables

__all__ = ["SchedulerState"]


class SchedulerState:
    """Fields of one scheduler: the fleet, its live tables, queues, memory, breakers."""

    policy: Policy
    clock: Clock
    placement: str
    devices: tuple[DeviceSpec, ...]
    fleet: FleetCosts
    memory: list[MemoryManager]
    tables: dict[str, StageTables]
    queues: dict[str, StageQueue]
    _queued: LiveTally  # live tasks over every stage's queue
    load_wait_s: dict[str, float]
    kv_block_tokens: int
    weights: PlacementWeights
    smoothing: float
    backlog: np.ndarray
    in_flight: np.ndarray
    healthy: np.ndarray
    decisions: deque[PlacementDecision]
    stats: SchedulerStats
    outputs_on_host: bool
    _can_run: Callable[[str, str, str], bool]
    _fits: dict[tuple[str, int], tuple[int, int | None]]
    _misplaced: dict[str, list[str]]
    _local: dict[str, np.ndarray]
    _required: dict[str, bool]
    _preferred: set[str]
    _bounded: bool
    _drains: dict[int, tuple[int, tuple[str, ...]]]
    _unit_weights: bool
    _bounded_search: bool
    _search: str | None
    _base_masks: dict[str, np.ndarray]
    _compute_group: np.ndarray
    _grouped: bool
    _groups: int
    _breakers: dict[tuple[str, int], DeviceBreaker]
    _breaker_blocked: dict[str, np.ndarray]
    _not_closed: dict[str, set[int]]
    _round_robin: dict[str, int]
    _blocked_stages: set[str]
    _retry_blocked_at: float
    _spread_placed_at: dict[str, np.ndarray]
    _kv_pace: dict[str, tuple[BandwidthHint, np.ndarray]]
    _kv_keys: tuple[str, ...]
    _kv_device_figures: dict[str, tuple[BandwidthHint, np.ndarray, np.ndarray]]
    # each device's correction as warm-up set it, per (model key, device index); absent: 1.0
    _calibrated: dict[tuple[str, int], float]
    # how far apart a probe's timed runs were (slowest over fastest), per (stage, device
    # index); absent: 1.0 (not probed, or a simulated fleet)
    _probe_spread: dict[tuple[str, int], float]
    # the share of its host's cores a probe kept busy, per (stage, device index), and per
    # stage the weights they give placement while the cores are busy (core_shares.py)
    _core_share: dict[tuple[str, int], float]
    _core_weights: dict[str, np.ndarray]
    # a model's load timed where it ran, per (model key, device index): replaces the guess
    _loads: dict[tuple[str, int], float]

    def _backlog_moved(self, index: int) -> None:
        """Device ``index``'s backlog changed: the bounded search's host floors of every
        stage must look at it again."""
        if self._bounded_search:
            for tables in self.tables.values():
                tables.moved.add(index)

    def _unblock(self) -> None:
        """Something changed (a completion, health): every blocked stage may try again."""
        self._blocked_stages.clear()
        self._retry_blocked_at = np.inf
