"""A throwaway redis-server on a free loopback port (tests and `hetero bench cache`)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

READY_TIMEOUT_S = 20.0


__all__ = ["RedisServer", "free_port"]


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """``redis-server`` as a child process; ``url`` once started."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (`make test` installs it)")
        self.binary = binary
        self.directory = directory
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Where it listens."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start it (no persistence) and wait until it answers PING."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:  # readiness: the server answers PING (polled, not a fixed sleep)
            try:
                if client.ping():
                    return self
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.01)

    def stop(self) -> None:
        """Kill it."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None
