"""Admission for one stage: the complexity breaker and the queue depth that degrades.

One object decides for the engine (live requests) and the simulator (virtual ones): a request
is admitted to the ``full`` variant, degraded to ``light`` (with the reason: its complexity
against the stage's recent requests, or the stage's queue at or over
``server.degrade_queue_depth``), or shed with a 429 and a Retry-After.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero.framework.errors import ShedError
from hetero.framework.policy import Policy
from hetero.framework.scheduler.breakers import Admission, ComplexityBreaker, RequestProfile

__all__ = ["AdmissionResult", "StageAdmission"]


@dataclass(frozen=True, slots=True)
class AdmissionResult:
    """The variant a request runs; ``cause`` is ``queue`` or ``complexity`` when degraded."""

    variant: str
    reason: str = ""
    cause: str = ""


class StageAdmission:
    """A complexity breaker per stage, plus the queue-depth rule, for one policy."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._breakers: dict[str, ComplexityBreaker] = {}

    def breaker(self, stage: str) -> ComplexityBreaker:
        """The complexity breaker of ``stage``."""
        breaker = self._breakers.get(stage)
        if breaker is None:
            breaker = ComplexityBreaker(self.policy.spec.circuit_breaker.complexity)
            self._breakers[stage] = breaker
        return breaker

    def decide(
        self,
        stage: str,
        qos_class: str,
        profile: RequestProfile | None,
        *,
        depth: int,
        queue_delay_s: float,
    ) -> AdmissionResult:
        """Where a request of ``stage`` goes; :class:`ShedError` (429) to refuse it.

        ``depth`` is the stage's queued and running tasks, ``queue_delay_s`` how long a new
        one would wait. Only requests that state a ``profile`` are judged by complexity.
        """
        spec = self.policy.spec
        deadline_s = spec.sla_tiers[spec.qos.classes[qos_class].sla_tier].deadline_ms / 1000.0
        reason = cause = ""
        if profile is not None:
            decision = self.breaker(stage).decide(profile, queue_delay_s, deadline_s)
            if decision.action is Admission.SHED:
                raise ShedError(decision.reason, status=429, retry_after_s=decision.retry_after_s)
            if decision.action is Admission.DEGRADE:
                reason, cause = decision.reason, "complexity"
        if depth >= spec.server.degrade_queue_depth:
            reason = f"queue depth {depth} >= {spec.server.degrade_queue_depth}"
            cause = "queue"
        if reason and "light" in spec.stages[stage].variants:
            return AdmissionResult("light", reason, cause)
        return AdmissionResult("full")
