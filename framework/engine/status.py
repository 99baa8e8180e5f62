"""What the engine's parts share: a stage's status, the access gate's
interface, and how a failure is told in one line."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hetero.framework.errors import HeteroError

__all__ = [
    "CACHE_DEVICE",
    "AccessGate",
    "AccessRefusedError",
    "Progress",
    "StageStatus",
    "describe_failure",
]

CACHE_DEVICE = "cache"  # where a cached output "lives": the host, for transfer costs
RECENT_RUNS = 4096
Progress = Callable[[str, str], None]


class AccessGate(Protocol):
    """Decides whether a principal may run a stage that touches a partition (and records the
    decision), and masks what the stage returns for that principal.
    ``hetero.sandbox.gate.ComplianceGate`` is the implementation."""

    def authorize(self, principal: Any, stage: str, request_id: str) -> None:
        """Return to allow; raise (a ``PermissionError``) to refuse."""
        ...

    def mask(self, principal: Any, stage: str, value: Any) -> Any:
        """``value`` with the fields ``principal`` may not see masked."""
        ...


class AccessRefusedError(HeteroError, PermissionError):
    """A request reaches a partition the engine may not touch."""


@dataclass
class StageStatus:
    """Where a stage stands: ``waiting``, ``loading``, ``ready`` or ``failed`` (with why)."""

    state: str = "waiting"
    reason: str = ""
    timings: dict[str, float | str] = field(default_factory=dict)
    idle: dict[str, str] = field(default_factory=dict)  # devices left without it, and why
    recent_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_RUNS))
    light_runs: int = 0
    batches: int = 0


def describe_failure(err: BaseException) -> str:
    """One line: what went wrong (hetero's errors carry the fix in their message)."""
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else ""
    if isinstance(err, HeteroError):
        return text or type(err).__name__
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
