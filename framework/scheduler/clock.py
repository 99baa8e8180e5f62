"""Clocks: everything time-dependent reads one, so the same code runs on the wall clock in the
engine and on a virtual clock in the simulator."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "VirtualClock", "WallClock"]


class Clock(Protocol):
    """Seconds on a monotonic timeline."""

    def now(self) -> float:
        """The current time."""
        ...


class WallClock:
    """``time.monotonic``."""

    def now(self) -> float:
        """The current monotonic time."""
        return time.monotonic()


class VirtualClock:
    """Time that moves only when told to (the simulator and deterministic tests)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        """The current virtual time."""
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (never backward); returns the new time."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self._now += seconds
        return self._now

    def advance_to(self, when: float) -> float:
        """Move forward to ``when`` (a time in the past is a no-op)."""
        self._now = max(self._now, when)
        return self._now
