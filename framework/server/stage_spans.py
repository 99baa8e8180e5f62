"""The spans of one stage of one request, from what admission, the cache and the engine
noted (:class:`~hetero.framework.engine.StepTrace`): queue wait, placement, model load, the
device run (or the sandbox round trip, for a stage placed on a partition's sandbox)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from hetero.framework.engine import StepTrace
from hetero.framework.tracing import AttributeValue, Span, current_trace

if TYPE_CHECKING:
    from hetero.framework.server.served import StageRun

__all__ = ["StageSpans", "engine_spans"]

SANDBOX_PREFIX = "sandbox:"  # hetero.sandbox.device.sandbox_device's ids


def engine_spans(steps: Iterable[StepTrace]) -> list[Span]:
    """Child spans of a stage for the steps the engine ran."""
    out: list[Span] = []
    for step in steps:
        where: dict[str, AttributeValue] = {
            "hetero.stage": step.stage,
            "hetero.device": step.device,
        }
        out.append(
            Span("queue_wait", step.queued_at, step.started_at, {"hetero.stage": step.stage})
        )
        out.append(
            Span(
                "placement",
                step.started_at,
                step.started_at,
                {**where, "hetero.estimate_s": step.estimate_s, "hetero.model_load": step.loaded},
            )
        )
        run_at = step.started_at + step.load_s
        if step.loaded:
            out.append(Span("model_load", step.started_at, run_at, where))
        sandboxed = step.device.startswith(SANDBOX_PREFIX)
        out.append(
            Span(
                "sandbox_round_trip" if sandboxed else "device_run",
                run_at,
                run_at + step.run_s,
                {**where, "hetero.variant": step.variant, "hetero.batch_size": step.batch_size},
            )
        )
    return out


class StageSpans:
    """Collects one stage's spans while it runs and records them under the current request's
    span when it is done (nothing at all when the trace does not record)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.trace = current_trace()  # taken now: a stream ends in another call stack
        self.began = time.monotonic()
        self.spans: list[Span] = []
        self.devices: list[str] = []

    def admitted(self, variant: str, reason: str, ended: float | None = None) -> None:
        """Admission chose ``variant`` (``reason``: why it degraded, if it did), by
        ``ended`` (now by default)."""
        if self.trace.recording:
            attributes: dict[str, AttributeValue] = {
                "hetero.variant": variant,
                "hetero.degraded": bool(reason),
            }
            if reason:
                attributes["hetero.degraded_because"] = reason
            end = time.monotonic() if ended is None else ended
            self.spans.append(Span("admission", self.began, end, attributes))

    def cache_lookup(self, began: float, tier: str | None, ended: float | None = None) -> None:
        """The feature cache was asked from ``began`` to ``ended`` (now by default); ``tier``
        had it (None: a miss)."""
        if self.trace.recording:
            attributes: dict[str, AttributeValue] = {
                "hetero.cache.hit": tier is not None,
                "hetero.cache.tier": tier or "",
            }
            end = time.monotonic() if ended is None else ended
            self.spans.append(Span("cache_lookup", began, end, attributes))

    def ran(self, steps: Iterable[StepTrace]) -> None:
        """The engine ran ``steps``."""
        if self.trace.recording:
            steps = list(steps)
            self.devices.extend(step.device for step in steps)
            self.spans.extend(engine_spans(steps))

    def streamed(self, began: float, first_at: float | None, tokens: int) -> None:
        """A stream that began at ``began`` sent ``tokens`` pieces, the first at ``first_at``."""
        if self.trace.recording:
            attributes: dict[str, AttributeValue] = {"hetero.tokens": tokens}
            if first_at is not None:
                attributes["hetero.time_to_first_token_s"] = first_at - began
            self.spans.append(Span("stream", began, time.monotonic(), attributes))

    def done(self, run: StageRun, cache_hits: int = 0, ended: float | None = None) -> None:
        """Record the stage's span, with everything collected under it, ending at ``ended``
        (the end of its last child, or now)."""
        if not self.trace.recording:
            return
        attributes: dict[str, AttributeValue] = {
            "hetero.stage": self.stage,
            "hetero.device": self.devices[-1] if self.devices else run.device,
            "hetero.variant": run.variant,
            "hetero.cached": run.cached,
        }
        if cache_hits:
            attributes["hetero.cache.hits"] = cache_hits
        ends = [span.end_s for span in self.spans] + ([ended] if ended is not None else [])
        end = max(ends) if ends else time.monotonic()
        stage = Span(f"stage {self.stage}", self.began, end, attributes)
        self.trace.record(stage, self.spans)
