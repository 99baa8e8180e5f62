"""The FastAPI application over a :class:`Serving`."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI

from hetero.framework.registry import Registry
from hetero.framework.server import routes_admin, routes_modal, routes_openai, routes_ops
from hetero.framework.server.auth import KeyRing
from hetero.framework.server.errors import install_error_handlers
from hetero.framework.server.middleware import BodyLimit, HostGuard, RequestMetrics
from hetero.framework.server.openapi import describe_openapi
from hetero.framework.server.reload import PinPolicy, PolicyReloader
from hetero.framework.server.routes_policy import add_policy_routes
from hetero.framework.server.serving import Serving
from hetero.framework.server.tracing_middleware import RequestTracing
from hetero.framework.tracing import build_tracer

__all__ = ["create_app", "device_list"]

logger = logging.getLogger(__name__)


def device_list(registry: Registry | None) -> list[dict[str, Any]]:
    """The devices of every available backend, as JSON (empty when discovery fails)."""
    if registry is None:
        return []
    from hetero.framework.fleet import discover_devices

    try:
        found, _ = discover_devices(registry)
    except Exception as err:  # a broken probe must not stop the server
        logger.warning("device discovery failed: %s", err)
        return []
    return [device.to_dict() for device in found]


def create_app(runtime: Serving, *, registry: Registry | None = None) -> FastAPI:
    """The HTTP API; the runtime may still be loading (``/ready`` says 503 until it is)."""
    spec = runtime.spec
    app = FastAPI(title="hetero", version="0.1.0", docs_url=None, redoc_url=None)
    app.state.runtime = runtime
    app.state.keyring = KeyRing(spec.server, spec.qos, frozenset(spec.sla_tiers))
    app.state.devices = device_list(registry)
    install_error_handlers(app)
    # The peers harness's API, for side-by-side measurements, matched first (routes are tried
    # in order): its two paths shadow no built-in one.
    if spec.server.peer_routes:
        from hetero.framework.server import peer_api

        app.include_router(peer_api.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_modal.router)
    app.include_router(routes_ops.router)
    app.include_router(routes_admin.router)
    add_policy_routes(app, spec.routes)  # last: a built-in path always wins
    describe_openapi(app, spec.server.limits)
    limits = spec.server.limits
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes, timeout_s=limits.body_timeout_s)
    app.add_middleware(
        HostGuard,
        allowed_hosts=spec.server.allowed_hosts,
        allowed_origins=spec.server.allowed_origins,
    )
    app.add_middleware(RequestMetrics, metrics=runtime.metrics)
    app.add_middleware(PinPolicy, runtime=runtime)
    app.state.reloader = PolicyReloader(runtime, app.state, runtime.metrics.policy_reloads)
    tracer = build_tracer(spec.tracing)
    app.state.tracer = tracer
    app.add_middleware(RequestTracing, tracer=tracer)  # outermost: every answer has its ids
    app.router.on_shutdown.append(tracer.shutdown)  # exports what is buffered
    return app
