"""ASGI middleware: the body size limit (413 before or while reading) and request metrics."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hetero.framework.engine import Metrics
from hetero.framework.server.errors import APIError, error_response

__all__ = ["BodyLimit", "RequestMetrics"]


class BodyLimit:
    """Refuse bodies over ``limit`` bytes: at once by Content-Length, else while streaming."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    def _error(self, size: str) -> APIError:
        return APIError(
            413,
            f"request body of {size} is over the limit of {self.limit} bytes",
            code="request_too_large",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await error_response(self._error(f"{int(length)} bytes"))(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise self._error(f"more than {seen} bytes")
            return message

        await self.app(scope, limited, send)


class RequestMetrics:
    """``hetero_requests_total{route,status}`` and ``hetero_request_duration_seconds{route}``,
    labelled by the matched route's template (never the raw path)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.monotonic()
        status = 500

        async def recording(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording)
        finally:
            route: Any = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            self.metrics.http_requests.labels(label, str(status)).inc()
            self.metrics.http_duration.labels(label).observe(time.monotonic() - began)
