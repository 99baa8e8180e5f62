"""The state the simulation's parts share (its events and requests, its device runs and loads,
its continuous-batching engines), declared once so each part's file type-checks on its own;
:class:`~hetero.framework.simulator.run._Simulation` sets every field."""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

import numpy as np

from hetero.framework.devices import DeviceSpec
from hetero.framework.engine.requests import RequestState
from hetero.framework.scheduler import Batcher, Dispatch, Scheduler, VirtualClock
from hetero.framework.scheduler.warmup import PredictiveWarmup
from hetero.framework.simulator.admission import SimAdmission
from hetero.framework.simulator.decode import DecodeEngine
from hetero.framework.simulator.kv import PagedKv
from hetero.framework.simulator.metrics import RunMetrics
from hetero.framework.simulator.workload import SimRequest, Workload

__all__ = [
    "ARRIVAL",
    "BATCH_DONE",
    "ENGINE_DONE",
    "LOAD_DONE",
    "TIMER",
    "WARMUP",
    "SimulationState",
]

ARRIVAL, BATCH_DONE, TIMER, WARMUP, LOAD_DONE, ENGINE_DONE = 0, 1, 2, 3, 4, 5


@dataclass(slots=True)
class _RequestRun:
    request: SimRequest
    state: RequestState  # its walk: admitted variants, outputs, live tasks, shares held
    client: int | None


@dataclass
class _DeviceSim:
    spec: DeviceSpec
    batchers: dict[str, Batcher[Dispatch]] = field(default_factory=dict)
    loaded: set[str] = field(default_factory=set)
    prefetch: list[str] = field(default_factory=list)  # warm-up loads not started yet
    busy: bool = False
    engines: dict[str, DecodeEngine[Dispatch]] = field(default_factory=dict)  # continuous LLMs
    engine_key: str | None = None  # the engine whose work the device runs now

    def engine_work(self) -> bool:
        """An engine has sequences waiting or running."""
        return any(engine.has_work for engine in self.engines.values())


class SimulationState:
    """Fields of one simulation: its clock and events, the scheduler, the simulated devices,
    the requests in flight and the figures it gathers."""

    workload: Workload
    clock: VirtualClock
    scheduler: Scheduler
    warmup: PredictiveWarmup | None
    admission: SimAdmission
    devices: dict[str, _DeviceSim]
    events: list[tuple[float, int, int, object]]
    sequence: itertools.count[int]
    runs: dict[int, _RequestRun]
    metrics: RunMetrics
    lowest_class: str
    capacity: np.ndarray
    model_bytes: np.ndarray
    memory_moved: set[int]  # devices whose resident models' bytes may have changed
    last_used: np.ndarray | None
    last_kv: dict[int, float]
    last_figures: tuple[float, float] | None
    last_memory_time: float
    order: dict[str, int]  # each device's index in the fleet
    device_ids: list[str]
    modality: dict[str, str]  # per stage
    kv: PagedKv
    load_draws: random.Random

    def push(self, when: float, kind: int, payload: object) -> None:
        """An event at ``when``, after those already queued for the same time."""
        heapq.heappush(self.events, (when, next(self.sequence), kind, payload))

    def _finish(self, dispatch: Dispatch, device_id: str, run_s: float, batch_size: int) -> None:
        """One task's stage is done (the simulation's requests part sets what follows)."""
        raise NotImplementedError
