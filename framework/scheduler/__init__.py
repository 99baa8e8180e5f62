"""Scheduling: clocks, QoS queues with aging, placement, memory, batching, circuit breakers."""

from hetero.framework.scheduler.batching import Batcher
from hetero.framework.scheduler.breakers import (
    Admission,
    AdmissionDecision,
    BreakerState,
    ComplexityBreaker,
    DeviceBreaker,
    RequestProfile,
)
from hetero.framework.scheduler.clock import Clock, VirtualClock, WallClock
from hetero.framework.scheduler.memory import LoadPlan, MemoryManager
from hetero.framework.scheduler.queues import StageQueue, overtaking_window, starvation_bound
from hetero.framework.scheduler.scheduler import (
    PLACEMENTS,
    Dispatch,
    PlacementDecision,
    Rejection,
    Scheduler,
)
from hetero.framework.scheduler.tasks import OutputHandle, StageTask

__all__ = [
    "PLACEMENTS",
    "Admission",
    "AdmissionDecision",
    "Batcher",
    "BreakerState",
    "Clock",
    "ComplexityBreaker",
    "DeviceBreaker",
    "Dispatch",
    "LoadPlan",
    "MemoryManager",
    "OutputHandle",
    "PlacementDecision",
    "Rejection",
    "RequestProfile",
    "Scheduler",
    "StageQueue",
    "StageTask",
    "VirtualClock",
    "WallClock",
    "overtaking_window",
    "starvation_bound",
]
