"""Circuit breaking in two layers.

**Complexity** (admission): what a request will cost on the stage's devices, against its QoS
class's deadline. The caller estimates the request's run time (the stage's measured pace times
the request's size: its profile, a weighted sum of text tokens per 1,000, megapixels and audio
seconds per 30 s, or its item count) and the wait for the work already queued. A request that
fits well inside its deadline runs ``full``; one that would use more than ``degrade_at`` of it
runs the stage's ``light`` variant where there is one; one that cannot finish by its deadline
behind the queue is shed with a Retry-After: the time until the queue has drained enough. A
stage with nothing queued or running admits anything (there is nobody to protect). Nothing here
looks at other clients' requests, so a stream of tiny ones cannot make a normal one look heavy.

**Failure** (per stage and device): closed / open / half-open over a count-based sliding window
of outcomes, as resilience4j does it: once ``min_calls`` calls are in the window, an error rate
or a slow-call rate at or above its threshold opens the breaker; after ``open_s`` it lets
``half_open_probes`` calls through; if they all succeed it closes, and any failure reopens it.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass, field

from hetero.framework.policy.schema import ComplexityBreaker as ComplexityConfig
from hetero.framework.policy.schema import DeviceBreaker as DeviceBreakerConfig
from hetero.framework.request_profile import RequestProfile

__all__ = [
    "Admission",
    "AdmissionDecision",
    "BreakerState",
    "ComplexityBreaker",
    "DeviceBreaker",
    "RequestProfile",
]

logger = logging.getLogger(__name__)


class Admission(enum.StrEnum):
    """What admission decided."""

    ADMIT = "admit"
    DEGRADE = "degrade"
    SHED = "shed"


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """The decision, with the numbers behind it (seconds)."""

    action: Admission
    expected_s: float = 0.0  # queue wait plus this request's run, as estimated
    retry_after_s: float = 0.0
    reason: str = ""


class ComplexityBreaker:
    """Admission by a request's estimated cost against its deadline (see the module doc)."""

    def __init__(self, config: ComplexityConfig) -> None:
        self.config = config
        self.counts = dict.fromkeys(Admission, 0)

    def decide(
        self,
        run_s: float,
        queue_delay_s: float,
        deadline_s: float,
        *,
        light_run_s: float | None = None,
        busy: bool = True,
    ) -> AdmissionDecision:
        """Admit, degrade or shed a request that runs ``run_s`` (``light_run_s`` on the light
        variant, None: no light variant) after a queue of ``queue_delay_s``; ``busy``: the stage
        has work queued or running."""
        expected = queue_delay_s + run_s
        decision = AdmissionDecision(Admission.ADMIT, expected)
        if busy and expected > self.config.degrade_at * deadline_s:
            within = f"{expected:.2f} s (queue {queue_delay_s:.2f} s + run {run_s:.2f} s)"
            if light_run_s is not None and queue_delay_s + light_run_s <= deadline_s:
                reason = f"expected {within} > {self.config.degrade_at:g} of the deadline"
                decision = AdmissionDecision(Admission.DEGRADE, expected, reason=reason)
            elif expected > deadline_s:
                fastest = min(run_s, light_run_s) if light_run_s is not None else run_s
                decision = AdmissionDecision(
                    Admission.SHED,
                    expected,
                    retry_after_s=max(1.0, queue_delay_s + fastest - deadline_s),
                    reason=f"cannot finish by its {deadline_s:g} s deadline: expected {within}",
                )
        self.counts[decision.action] += 1
        return decision


class BreakerState(enum.StrEnum):
    """resilience4j's three states."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(slots=True)
class DeviceBreaker:
    """The failure breaker of one (stage, device)."""

    name: str
    config: DeviceBreakerConfig
    state: BreakerState = BreakerState.CLOSED
    opened_at: float = 0.0
    transitions: int = 0
    _outcomes: deque[tuple[bool, bool]] = field(default_factory=deque)
    _probes_left: int = 0
    _probe_successes: int = 0
    _errors: int = 0  # failed calls in the window, kept as outcomes come and go
    _slow: int = 0  # slow calls in the window

    def allows(self, now: float) -> bool:
        """Whether a call may go through now (an open breaker half-opens after ``open_s``)."""
        if self.state is BreakerState.OPEN and now - self.opened_at >= self.config.open_s:
            self._move(BreakerState.HALF_OPEN, now)
            self._probes_left = self.config.half_open_probes
            self._probe_successes = 0
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.HALF_OPEN:
            return self._probes_left > 0
        return False

    def admit_probe(self) -> None:
        """A half-open breaker spends one probe on the call being placed."""
        if self.state is BreakerState.HALF_OPEN and self._probes_left > 0:
            self._probes_left -= 1

    def record(self, ok: bool, duration_s: float, now: float) -> None:
        """Fold in one call's outcome."""
        slow = duration_s >= self.config.slow_call_s
        if self.state is BreakerState.HALF_OPEN:
            if not ok or slow:
                self._move(BreakerState.OPEN, now)
                return
            self._probe_successes += 1
            if self._probe_successes >= self.config.half_open_probes:
                self._move(BreakerState.CLOSED, now)
            return
        self._outcomes.append((ok, slow))
        self._errors += not ok
        self._slow += slow
        if len(self._outcomes) > self.config.window:
            good, was_slow = self._outcomes.popleft()
            self._errors -= not good
            self._slow -= was_slow
        if self.state is BreakerState.CLOSED and len(self._outcomes) >= self.config.min_calls:
            calls = len(self._outcomes)
            errors = self._errors / calls
            slow_rate = self._slow / calls
            if errors >= self.config.error_rate or slow_rate >= self.config.slow_call_rate:
                self._move(BreakerState.OPEN, now)

    def _move(self, state: BreakerState, now: float) -> None:
        logger.warning("breaker %s: %s -> %s", self.name, self.state.value, state.value)
        self.state = state
        self.transitions += 1
        if state is BreakerState.OPEN:
            self.opened_at = now
        if state is BreakerState.CLOSED:
            self._outcomes.clear()
            self._errors = self._slow = 0
