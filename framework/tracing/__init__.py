"""Request tracing: a span per request and child spans per stage, exported with OpenTelemetry
when the policy's ``tracing:`` section enables it (the ``hetero[otel]`` extra).

Off, :func:`build_tracer` gives a :class:`Tracer` that records nothing and no OpenTelemetry
module is imported; the request and trace ids still reach the response headers and error
bodies (the trace id of a client's ``traceparent``, when it sent one).
"""

from hetero.framework.tracing.api import (
    AttributeValue,
    RequestTrace,
    Span,
    Tracer,
    current_trace,
    use_trace,
)
from hetero.framework.tracing.build import build_tracer

__all__ = [
    "AttributeValue",
    "RequestTrace",
    "Span",
    "Tracer",
    "build_tracer",
    "current_trace",
    "use_trace",
]
