"""W3C Trace Context ``traceparent`` headers, parsed without OpenTelemetry (tracing off)."""

from __future__ import annotations

import re

__all__ = ["format_traceparent", "parse_traceparent"]

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def parse_traceparent(value: str | None) -> tuple[str, str, bool] | None:
    """(trace id, parent span id, sampled) of a valid header; None otherwise (an all-zero id
    or version ``ff`` is invalid, as the specification says)."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None:
        return None
    version, trace_id, span_id, flags = match.groups()
    if version == "ff" or set(trace_id) == {"0"} or set(span_id) == {"0"}:
        return None
    return trace_id, span_id, bool(int(flags, 16) & 1)


def format_traceparent(trace_id: str, span_id: str, sampled: bool) -> str:
    """The header for a span."""
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"
