"""The engine's bookkeeping of one request: its pipeline, finished steps and its future."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from hetero.framework.scheduler.tasks import OutputHandle, StageTask
from hetero.framework.stages import Pipeline

__all__ = ["EngineResult", "RequestState", "StepTrace", "settle"]


@dataclass(frozen=True, slots=True)
class StepTrace:
    """How one step of a request ran, for its trace: times are ``time.monotonic`` seconds.

    ``queued_at`` to ``started_at`` is the queue wait (and batching delay); ``load_s`` the
    model load this batch needed first (0: resident); ``run_s`` the device call of the whole
    batch of ``batch_size`` items; ``estimate_s`` placement's estimated completion.
    """

    step: str
    stage: str
    device: str
    variant: str
    queued_at: float
    started_at: float
    load_s: float
    run_s: float
    batch_size: int
    estimate_s: float
    loaded: bool


@dataclass(frozen=True, slots=True)
class EngineResult:
    """A finished request: the outputs of its sink steps (arrays for bare graphs, a plugin's
    result otherwise), the device each step ran on, and how it went."""

    request_id: str
    outputs: dict[str, Any]
    devices: dict[str, str]
    degraded: bool
    latency_s: float
    variant: str = "full"
    steps: tuple[StepTrace, ...] = ()
    cached: dict[str, str] = field(default_factory=dict)
    """Steps the feature cache answered, and the tier that had each."""
    variants: dict[str, str] = field(default_factory=dict)
    """The variant each step ran (admission's choice per step)."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Why admission degraded a step to its light variant, by step."""
    model_versions: dict[str, str] = field(default_factory=dict)
    """The model version each step ran on (the engine's choice: a canary's, say)."""


@dataclass(slots=True)
class RequestState:
    """What the engine knows of a request in flight."""

    request_id: str
    route: str
    pipeline: Pipeline
    payload: Any
    qos_class: str
    variant: str
    arrival: float
    deadline: float
    future: Future[EngineResult] = field(default_factory=Future)  # the caller's answer
    units: float = 0.0  # complexity units of its profile (0: none stated)
    holders: list[tuple[str, str]] = field(default_factory=list)  # (stage, principal) shares held
    principal: Any = None
    variants: dict[str, str] = field(default_factory=dict)  # by step; else ``variant``
    reasons: dict[str, str] = field(default_factory=dict)  # why a step was degraded
    step_units: dict[str, float] = field(default_factory=dict)  # by step; else ``units``
    payloads: dict[str, Any] = field(default_factory=dict)  # by step, known or composed
    composers: dict[str, Callable[[Mapping[str, Any]], Any]] = field(default_factory=dict)
    keys: dict[str, Any] = field(default_factory=dict)  # feature-cache key by step, for fills
    cached: dict[str, str] = field(default_factory=dict)  # steps the cache answered: tier
    answer: tuple[str, ...] | None = None  # steps whose outputs the caller gets (None: sinks)
    outputs: dict[str, OutputHandle] = field(default_factory=dict)
    devices: dict[str, str] = field(default_factory=dict)
    live_tasks: dict[int, StageTask] = field(default_factory=dict)
    steps: list[StepTrace] = field(default_factory=list)
    redos: int = 0  # times its steps were made again for lost inputs (MAX_INPUT_REDOS)

    def ready_steps(self) -> list[str]:
        """Steps not started whose dependencies are all done."""
        started = set(self.outputs) | {t.step for t in self.live_tasks.values()}
        return self.pipeline.ready_steps(self.outputs, started)

    def done(self) -> bool:
        """Every sink step has its output."""
        return all(sink in self.outputs for sink in self.pipeline.sinks)


def settle(
    future: Future[EngineResult],
    *,
    result: EngineResult | None = None,
    error: BaseException | None = None,
) -> None:
    """Complete a future unless the caller already cancelled it."""
    try:
        if error is not None:
            future.set_exception(error)
        elif result is not None:
            future.set_result(result)
    except InvalidStateError:
        pass  # the caller cancelled it; the request's work was dropped with it
