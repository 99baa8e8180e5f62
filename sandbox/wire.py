"""Messages between the orchestrator and a sandbox worker: 4-byte big-endian length, then JSON.

Binary fields travel as base64 text. Frames are capped so a confused peer cannot make the other
side allocate without bound.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

__all__ = ["MAX_FRAME_BYTES", "WireError", "receive", "send"]

MAX_FRAME_BYTES = 64 * 2**20


class WireError(ConnectionError):
    """The peer closed the connection or sent something that is not a frame."""


def send(connection: socket.socket, message: dict[str, Any]) -> None:
    """Send one message."""
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise WireError(f"message of {len(body)} bytes is over the {MAX_FRAME_BYTES} byte cap")
    connection.sendall(struct.pack(">I", len(body)) + body)


def _exactly(connection: socket.socket, count: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < count:
        chunk = connection.recv(count - len(chunks))
        if not chunk:
            raise WireError("the peer closed the connection")
        chunks += chunk
    return bytes(chunks)


def receive(connection: socket.socket) -> dict[str, Any]:
    """Receive one message."""
    (length,) = struct.unpack(">I", _exactly(connection, 4))
    if length > MAX_FRAME_BYTES:
        raise WireError(f"frame of {length} bytes is over the {MAX_FRAME_BYTES} byte cap")
    try:
        message = json.loads(_exactly(connection, length))
    except ValueError as err:
        raise WireError(f"frame is not JSON: {err}") from None
    if not isinstance(message, dict):
        raise WireError("frame is not a JSON object")
    return message
