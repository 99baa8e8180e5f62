"""Tracing with OpenTelemetry: spans exported over OTLP/HTTP in batches. Imported only when
the policy enables tracing (the ``hetero[otel]`` extra)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as err:  # pragma: no cover - the extra is installed wherever tests run
    raise ImportError(
        f"tracing.enabled needs the OpenTelemetry packages ({err.name} is missing); "
        "fix: pip install 'hetero[otel]'"
    ) from err

from hetero.framework.policy.schema import TracingConfig
from hetero.framework.tracing.api import AttributeValue, RequestTrace, Span, Tracer
from hetero.framework.tracing.traceparent import format_traceparent

__all__ = ["OtelTracer"]


def _epoch_ns(monotonic_s: float, offset_ns: int) -> int:
    return int(monotonic_s * 1e9) + offset_ns


class _OtelTrace(RequestTrace):
    def __init__(
        self, tracer: trace.Tracer, root: trace.Span, request_id: str, method: str
    ) -> None:
        context = root.get_span_context()
        self._method = method
        super().__init__(request_id, trace.format_trace_id(context.trace_id))
        self._tracer = tracer
        self._root = root
        # monotonic -> epoch, fixed per request: spans keep their true order and lengths
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    @property
    def recording(self) -> bool:
        return self._root.is_recording()

    def traceparent(self) -> str:
        context = self._root.get_span_context()
        return format_traceparent(
            self.trace_id, trace.format_span_id(context.span_id), context.trace_flags.sampled
        )

    def record(self, stage: Span, children: Sequence[Span] = ()) -> None:
        if not self.recording:
            return
        parent = self._open(stage, self._root)
        for child in children:
            self._open(child, parent).end(end_time=_epoch_ns(child.end_s, self._offset_ns))
        parent.end(end_time=_epoch_ns(stage.end_s, self._offset_ns))

    def _open(self, span: Span, parent: trace.Span) -> trace.Span:
        return self._tracer.start_span(
            span.name,
            context=trace.set_span_in_context(parent),
            start_time=_epoch_ns(span.start_s, self._offset_ns),
            attributes=dict(span.attributes),
        )

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self._root.set_attribute(key, value)

    def end(self, status: int, route: str | None = None) -> None:
        if route is not None:
            self._root.set_attribute("http.route", route)
            self._root.update_name(f"{self._method} {route}")
        self._root.set_attribute("http.response.status_code", status)
        if status >= 500:
            self._root.set_status(Status(StatusCode.ERROR))
        self._root.end()


class OtelTracer(Tracer):
    """Spans to the OTLP/HTTP endpoint of ``config``, sampled by trace id ratio unless the
    client's ``traceparent`` already decided (parent-based)."""

    enabled = True

    def __init__(self, config: TracingConfig) -> None:
        self.config = config
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.sampling)),
        )
        self._provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=config.endpoint))
        )
        self._tracer = self._provider.get_tracer("hetero")
        self._propagator = TraceContextTextMapPropagator()

    def start(
        self, name: str, headers: Mapping[str, str], request_id: str, attributes: Mapping[str, Any]
    ) -> RequestTrace:
        context = self._propagator.extract(carrier=dict(headers))
        root = self._tracer.start_span(
            name,
            context=context,
            kind=SpanKind.SERVER,
            attributes={"hetero.request_id": request_id, **attributes},
        )
        method = str(attributes.get("http.request.method", "HTTP"))
        return _OtelTrace(self._tracer, root, request_id, method)

    def flush(self, timeout_s: float = 10.0) -> bool:
        return self._provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self._provider.shutdown()
