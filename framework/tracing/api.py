"""The tracing interface the server and :class:`~hetero.framework.server.serving.Serving` use,
and its no-op form (tracing off: nothing is recorded, nothing of OpenTelemetry is imported).

Stage work runs on lane threads, so stage spans are not opened around it: the engine notes
when each step queued, loaded and ran (:class:`~hetero.framework.engine.StepTrace`) and the
serving layer records those intervals afterwards as :class:`Span` values, with the times they
really had (``time.monotonic`` seconds).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hetero.framework.tracing.traceparent import parse_traceparent

__all__ = [
    "AttributeValue",
    "RequestTrace",
    "Span",
    "Tracer",
    "current_trace",
    "use_trace",
]

AttributeValue = str | bool | int | float


@dataclass(frozen=True, slots=True)
class Span:
    """A finished interval of a request: ``start_s``/``end_s`` are ``time.monotonic``."""

    name: str
    start_s: float
    end_s: float
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)


class RequestTrace:
    """One HTTP request's trace; this base class records nothing (tracing off).

    Attributes:
        request_id: The request's id (``X-Request-Id``).
        trace_id: 32 hex digits, or ``""`` when there is no trace (tracing off and the client
            sent no ``traceparent``).
    """

    def __init__(self, request_id: str, trace_id: str = "") -> None:
        self.request_id = request_id
        self.trace_id = trace_id

    @property
    def recording(self) -> bool:
        """Whether spans are kept (tracing on and this trace sampled)."""
        return False

    def traceparent(self) -> str | None:
        """The ``traceparent`` of the request's span, for the response; None when off."""
        return None

    def record(self, stage: Span, children: Sequence[Span] = ()) -> None:
        """A stage's span under the request's, with its children under it."""

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        """An attribute of the request's span."""

    def end(self, status: int, route: str | None = None) -> None:
        """The request answered with HTTP ``status``; ``route`` the matched route template
        (the span is named after it)."""


_NO_TRACE = RequestTrace("")
_current: contextvars.ContextVar[RequestTrace] = contextvars.ContextVar(
    "hetero_trace", default=_NO_TRACE
)


def current_trace() -> RequestTrace:
    """The trace of the request being handled (a no-op one outside a request)."""
    return _current.get()


@contextmanager
def use_trace(trace: RequestTrace) -> Iterator[RequestTrace]:
    """Make ``trace`` current for the code (and tasks started) inside the block."""
    token = _current.set(trace)
    try:
        yield trace
    finally:
        _current.reset(token)


class Tracer:
    """Starts a :class:`RequestTrace` per request; this base class is tracing off."""

    enabled = False

    def start(
        self, name: str, headers: Mapping[str, str], request_id: str, attributes: Mapping[str, Any]
    ) -> RequestTrace:
        """The trace of a request that arrives with ``headers`` (lower-case names)."""
        parent = parse_traceparent(headers.get("traceparent"))
        return RequestTrace(request_id, parent[0] if parent is not None else "")

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export what is buffered; True once done."""
        return True

    def shutdown(self) -> None:
        """Flush and stop exporting."""
