"""The tracer a policy asks for: the no-op :class:`Tracer` (:mod:`.api`) or OpenTelemetry's
(:mod:`.otel`, built on the interface in :mod:`.api`). Here, beside both, so neither imports
the other's way back."""

from __future__ import annotations

from hetero.framework.policy.schema import TracingConfig
from hetero.framework.tracing.api import Tracer

__all__ = ["build_tracer"]


def build_tracer(config: TracingConfig) -> Tracer:
    """The tracer ``config`` asks for: OpenTelemetry (imported only now) or off."""
    if not config.enabled:
        return Tracer()
    from hetero.framework.tracing.otel import OtelTracer

    return OtelTracer(config)
