"""What the scheduler hands its callers: a placed task, a refused one, and why it went where."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hetero.framework.errors import HeteroError
from hetero.framework.scheduler.memory import LoadPlan
from hetero.framework.scheduler.tasks import StageTask

__all__ = ["Dispatch", "PlacementDecision", "Rejection", "SchedulerStats"]


@dataclass(slots=True)
class PlacementDecision:
    """Why a task went where it went: the estimate and its terms, in seconds. A record for
    callers to read (not frozen: a frozen dataclass's ``__init__`` costs 3.0 us here against
    0.7 us, measured side by side, and one is made per decision)."""

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
class SchedulerStats:
    """Counters the engine and the simulator export."""

    counts: Counter[str] = field(default_factory=Counter)
