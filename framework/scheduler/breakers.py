"""Circuit breaking in two layers.

**Complexity** (admission): a request's profile is a weighted sum of its text tokens (per
1,000), image pixels (per megapixel) and audio seconds (per 30 s). Against the p95 of recent
profiles and the current queue delay, it is admitted, degraded to the stage's ``light`` variant,
or shed with a Retry-After. Until ``min_samples`` profiles have been seen, everything is
admitted.

**Failure** (per stage and device): closed / open / half-open over a count-based sliding window
of outcomes, as resilience4j does it: once ``min_calls`` calls are in the window, an error rate
or a slow-call rate at or above its threshold opens the breaker; after ``open_s`` it lets
``half_open_probes`` calls through; if they all succeed it closes, and any failure reopens it.
"""

from __future__ import annotations

import bisect
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
    """The decision, with the numbers behind it."""

    action: Admission
    score: float
    p95: float | None
    retry_after_s: float = 0.0
    reason: str = ""


class ComplexityBreaker:
    """Admission by request complexity against the live p95."""

    def __init__(self, config: ComplexityConfig) -> None:
        self.config = config
        self._recent: deque[float] = deque()
        self._sorted: list[float] = []
        self.counts = dict.fromkeys(Admission, 0)

    def _observe(self, score: float) -> None:
        self._recent.append(score)
        bisect.insort(self._sorted, score)
        if len(self._recent) > self.config.window:
            old = self._recent.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]

    def p95(self) -> float | None:
        """p95 of the recent profiles, once there are enough."""
        if len(self._sorted) < self.config.min_samples:
            return None
        return self._sorted[min(len(self._sorted) - 1, int(0.95 * len(self._sorted)))]

    def decide(
        self, profile: RequestProfile, queue_delay_s: float, deadline_s: float
    ) -> AdmissionDecision:
        """Admit, degrade or shed; the request's profile joins the window either way."""
        score = profile.score(self.config)
        p95 = self.p95()
        self._observe(score)
        decision = AdmissionDecision(Admission.ADMIT, score, p95)
        if p95 is not None and p95 > 0:
            ratio = score / p95
            # A queue that already eats the deadline lowers both thresholds: heavy work then
            # sheds at the usual degrade ratio and degrades at half of it.
            if queue_delay_s >= deadline_s:
                shed_at = self.config.degrade_above_p95
                degrade_at = self.config.degrade_above_p95 / 2
            else:
                shed_at = self.config.shed_above_p95
                degrade_at = self.config.degrade_above_p95
            if ratio >= shed_at:
                decision = AdmissionDecision(
                    Admission.SHED,
                    score,
                    p95,
                    retry_after_s=max(1.0, queue_delay_s),
                    reason=f"request complexity {ratio:.1f}x the recent p95",
                )
            elif ratio >= degrade_at:
                decision = AdmissionDecision(
                    Admission.DEGRADE, score, p95, reason=f"complexity {ratio:.1f}x p95"
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
        if len(self._outcomes) > self.config.window:
            self._outcomes.popleft()
        if self.state is BreakerState.CLOSED and len(self._outcomes) >= self.config.min_calls:
            calls = len(self._outcomes)
            errors = sum(1 for good, _ in self._outcomes if not good) / calls
            slow_rate = sum(1 for _, was_slow in self._outcomes if was_slow) / calls
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
