"""ASGI middleware: who may address the server (Host and Origin checks), the body size and
time limits (413 / 408 before or while reading), and request metrics."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hetero.framework.engine import Metrics
from hetero.framework.server.errors import APIError, error_response

__all__ = ["BodyLimit", "HostGuard", "RequestMetrics"]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


class HostGuard:
    """Refuse requests a browser was tricked into sending.

    DNS rebinding: a page on ``evil.example`` that resolves to 127.0.0.1 reaches a loopback
    server with ``Host: evil.example``; on a loopback socket only loopback names (and
    ``allowed_hosts``) are served (421). Cross-site POSTs: a page may send a multipart form to
    any address without asking first; a request whose ``Origin`` is neither the server's own
    nor in ``allowed_origins`` is refused (403). API clients send no ``Origin``.
    """

    def __init__(
        self, app: ASGIApp, allowed_hosts: tuple[str, ...], allowed_origins: tuple[str, ...]
    ) -> None:
        self.app = app
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self.allowed_origins = frozenset(o.lower().rstrip("/") for o in allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        host = headers.get(b"host", b"").decode("latin-1").lower()
        name = _host_name(host)
        local = scope.get("server") or ("", 0)
        if self.allowed_hosts:
            refused = name not in self.allowed_hosts
        else:
            refused = _is_loopback(str(local[0])) and name not in LOOPBACK_NAMES and bool(name)
        if refused:
            error = APIError(
                421,
                f"Host {host!r} is not served here (server.allowed_hosts)",
                code="misdirected_request",
            )
            await error_response(error)(scope, receive, send)
            return
        origin = headers.get(b"origin", b"").decode("latin-1").lower().rstrip("/")
        same = origin.split("://", 1)[-1] == host
        if origin and not same and origin not in self.allowed_origins:
            error = APIError(
                403,
                f"requests from the web page at {origin} are not allowed (server.allowed_origins)",
                code="origin_not_allowed",
            )
            await error_response(error)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _host_name(host: str) -> str:
    """``host`` without its port (``[::1]:8000`` -> ``[::1]``)."""
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_loopback(address: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


class BodyLimit:
    """Refuse bodies over ``limit`` bytes (413: at once by Content-Length, else while
    streaming) or not received within ``timeout_s`` of the first read (408)."""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float = 30.0) -> None:
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s

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
        deadline: float | None = None
        complete = False

        async def limited() -> Message:
            nonlocal seen, deadline, complete
            if complete:  # after the body, receive() only waits for a disconnect
                return await receive()
            deadline = deadline or asyncio.get_running_loop().time() + self.timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise APIError(
                    408,
                    f"the request body did not arrive within {self.timeout_s:g} s",
                    code="request_timeout",
                ) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
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
