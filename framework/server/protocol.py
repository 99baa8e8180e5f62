"""The HTTP/1.1 connection protocol ``hetero serve`` runs: uvicorn's httptools protocol (the
C parser FastAPI's own deployments use) with a time and a size limit on each request's line
and headers.

uvicorn closes idle keep-alive connections, but a client that sends a request's headers a
byte at a time holds its connection (and the memory of its partial request) for as long as
it likes; many such clients exhaust the server for everyone. Here a request's head must
arrive within ``header_timeout_s`` of its first byte (or of the connection opening), else
the connection is closed. Nor may a head grow past ``max_header_bytes`` (431): httptools
itself sets no bound (uvicorn's h11 protocol had h11's 16 KiB), and a head is held whole in
memory. Bodies have their own limits (``middleware.BodyLimit``).

Why httptools and not uvicorn's pure-Python h11 protocol (which this module guarded until
2026-12-06): parsing a request's head and framing its response is per-request work on the
server's one event-loop thread; docs/runs/serving.md (fourth session) gives the figures that
decided it.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["CoalescingTransport", "guarded", "guarded_http"]

P = TypeVar("P", H11Protocol, HttpToolsProtocol)


class CoalescingTransport:
    """A connection's transport whose response head leaves in one send with its body.

    uvicorn writes a response's status line and headers, then its body: two sends, two TCP
    segments, and a client that wakes for the head and again for the body. Here a write is held
    while nothing else is, and the next write sends both at once; a write that no other follows
    leaves at the end of the event loop's turn (a streamed response's chunks are not held
    longer). Everything else is the wrapped transport's."""

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Hold ``data`` if nothing is held, else send what is held and ``data`` together."""
        held = self._held
        if held is None:
            if data:  # a copy of a buffer the caller may reuse, as the transport would keep
                self._held = data if isinstance(data, bytes) else bytes(data)
                self._loop.call_soon(self._flush)
            return
        self._held = None
        self._transport.write(b"".join((held, data)) if data else held)

    def writelines(self, lines: Any) -> None:
        """As :meth:`write` with the lines joined."""
        self.write(b"".join(lines))

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        """Send what is held, then close."""
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        """Send what is held, then half-close."""
        self._flush()
        self._transport.write_eof()

    def abort(self) -> None:
        """Drop what is held and close at once."""
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        """The wrapped transport's buffer and what is held."""
        held = len(self._held) if self._held is not None else 0
        return int(self._transport.get_write_buffer_size()) + held

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _too_large(limit: int) -> bytes:
    body = orjson.dumps(
        {
            "error": {
                "message": f"the request's line and headers exceed {limit} bytes",
                "type": "invalid_request_error",
                "param": None,
                "code": "headers_too_large",
            }
        }
    )
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def guarded(protocol: type[P], header_timeout_s: float, max_header_bytes: int) -> type[P]:
    """``protocol`` (uvicorn's httptools or h11 one), closing connections whose request head
    is too slow or too large. Both keep the request being answered in ``cycle``; a new one is
    made once its head is complete, so "between requests" is: no cycle yet, or the last one
    answered."""
    too_large = _too_large(max_header_bytes)

    class Guarded(protocol):  # type: ignore[valid-type,misc]
        _head_due: asyncio.TimerHandle | None = None
        _head_bytes: int = 0  # of the head being received, before this chunk
        _tail: bytes = b""  # its last bytes: the blank line that ends it may span two chunks

        def connection_made(self, transport: Any) -> None:
            super().connection_made(CoalescingTransport(transport, self.loop))
            self._expect_head()

        def data_received(self, data: bytes) -> None:
            if self._between_requests():
                self._expect_head()
                if not self._head_fits(data):
                    if not self.transport.is_closing():
                        self.transport.write(too_large)
                        self.transport.close()
                    return
            super().data_received(data)
            if not self._between_requests() and self._head_due is not None:
                self._head_due.cancel()  # a request's head arrived: the body has its own limit
                self._head_due = None

        def _head_fits(self, data: bytes) -> bool:
            """Count ``data`` into the head being received (up to the blank line that ends
            it): whether the head stays within the limit."""
            seen = self._tail + data
            end = seen.find(b"\r\n\r\n")
            if end < 0:
                self._head_bytes += len(data)
                self._tail = seen[-3:]
                return self._head_bytes <= max_header_bytes
            size = self._head_bytes + end + 4 - len(self._tail)
            self._head_bytes, self._tail = 0, b""  # the next request's head starts afresh
            return size <= max_header_bytes

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_due is not None:
                self._head_due.cancel()
                self._head_due = None
            super().connection_lost(exc)

        def _between_requests(self) -> bool:
            return self.cycle is None or bool(self.cycle.response_complete)

        def _expect_head(self) -> None:
            if self._head_due is None:
                self._head_due = self.loop.call_later(header_timeout_s, self._too_slow)

        def _too_slow(self) -> None:
            self._head_due = None
            if self._between_requests() and not self.transport.is_closing():
                self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{protocol.__name__}"
    return Guarded


def guarded_http(header_timeout_s: float, max_header_bytes: int) -> type[HttpToolsProtocol]:
    """The protocol ``hetero serve`` runs: httptools, guarded (:func:`guarded`)."""
    return guarded(HttpToolsProtocol, header_timeout_s, max_header_bytes)
