"""A response's head leaves in one send with its body (framework/server/protocol.py,
``CoalescingTransport``); a write that nothing follows leaves when the event loop turns, and
closing sends what is held first. The transport underneath records its calls (the wrapper is
the unit here; every server test sends its responses through the real one)."""

from __future__ import annotations

import asyncio
from typing import Any

from hetero.framework.server.protocol import CoalescingTransport


class _Recorded:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def close(self) -> None:
        self.closing = True
        self.calls.append(("close", None))

    def abort(self) -> None:
        self.calls.append(("abort", None))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1234)}.get(name, default)


async def _turn() -> None:
    await asyncio.sleep(0)  # one turn of the loop: what call_soon scheduled has run


def test_a_head_and_its_body_leave_in_one_write_and_a_lone_write_when_the_loop_turns() -> None:
    async def scenario() -> None:
        inner = _Recorded()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        assert inner.calls == []  # held
        assert transport.get_write_buffer_size() == 7 + 19
        transport.write(b"{}")
        assert inner.calls == [("write", b"HTTP/1.1 200 OK\r\n\r\n{}")]
        await _turn()
        assert len(inner.calls) == 1  # nothing was left to send

        transport.write(b"data: 1\n\n")  # the control: a write nothing follows in this turn
        assert len(inner.calls) == 1
        await _turn()
        assert inner.calls[-1] == ("write", b"data: 1\n\n")

        transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        transport.write(b"")  # an empty body sends the head it follows
        assert inner.calls[-1] == ("write", b"HTTP/1.1 204 No Content\r\n\r\n")
        assert transport.get_extra_info("peername") == ("127.0.0.1", 1234)  # the rest: inner's

    asyncio.run(scenario())


def test_closing_sends_what_is_held_first_and_aborting_drops_it() -> None:
    async def scenario() -> None:
        inner = _Recorded()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 431 Too Large\r\n\r\n")
        transport.close()
        assert inner.calls == [("write", b"HTTP/1.1 431 Too Large\r\n\r\n"), ("close", None)]
        await _turn()
        assert len(inner.calls) == 2  # the held write left once

        dropped = _Recorded()
        transport = CoalescingTransport(dropped, asyncio.get_running_loop())
        transport.write(b"partial")
        transport.abort()
        await _turn()
        assert dropped.calls == [("abort", None)]

    asyncio.run(scenario())
