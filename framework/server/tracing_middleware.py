"""ASGI middleware giving every request an id and a trace: ``X-Request-Id`` (the client's,
when it is a plain token, else a new one), the W3C ``traceparent`` accepted and answered, and
``X-Trace-Id``; error bodies carry both ids (:func:`~hetero.framework.server.errors.error_response`
reads them from the current trace)."""

from __future__ import annotations

import re
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hetero.framework.tracing import Tracer, use_trace

__all__ = ["RequestTracing"]

_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class RequestTracing:
    """Outermost middleware: the trace is current for everything inside, error handlers
    included."""

    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get("x-request-id", "")
        request_id = given if _CLIENT_ID.match(given) else f"req-{uuid.uuid4().hex}"
        method = str(scope.get("method", "GET"))
        trace = self.tracer.start(
            f"{method} {scope.get('path', '')}",
            headers,
            request_id,
            {"http.request.method": method, "url.path": str(scope.get("path", ""))},
        )
        status = 500
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                route: Any = scope.get("route")
                trace.end(status, getattr(route, "path", None))

        async def tagged(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                end()  # before the last byte: a client that has the answer finds its span ended
            if message["type"] == "http.response.start":
                status = int(message["status"])
                extra = [(b"x-request-id", request_id.encode())]
                if trace.trace_id:
                    extra.append((b"x-trace-id", trace.trace_id.encode()))
                traceparent = trace.traceparent()
                if traceparent is not None:
                    extra.append((b"traceparent", traceparent.encode()))
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        with use_trace(trace):
            try:
                await self.app(scope, receive, tagged)
            finally:
                end()
