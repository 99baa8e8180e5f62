"""Admission for one stage: the complexity breaker and the queue depth that degrades.

One object decides for the engine (live requests) and the simulator (virtual ones): a request
is admitted to the ``full`` variant, degraded to ``light`` (with the reason: its estimated cost
against its deadline, or the stage's queue at or over ``server.degrade_queue_depth``), or shed
with a 429 and a Retry-After when it cannot finish by its deadline behind the queue. The
caller estimates the costs (the engine from measured paces, the simulator from its model).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero.framework.errors import ShedError
from hetero.framework.policy import Policy
from hetero.framework.scheduler.breakers import Admission, ComplexityBreaker

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
        self._deadlines: tuple[Policy | None, dict[str, float]] = (None, {})

    def breaker(self, stage: str) -> ComplexityBreaker:
        """The complexity breaker of ``stage``."""
        breaker = self._breakers.get(stage)
        if breaker is None:
            breaker = ComplexityBreaker(self.policy.spec.circuit_breaker.complexity)
            self._breakers[stage] = breaker
        return breaker

    def deadline_s(self, qos_class: str) -> float:
        """The deadline of a QoS class's SLA tier, in seconds."""
        policy, deadlines = self._deadlines
        if policy is not self.policy:  # read per request: kept per policy as a plain dict
            spec = self.policy.spec
            deadlines = {
                name: spec.sla_tiers[c.sla_tier].deadline_ms / 1000.0
                for name, c in spec.qos.classes.items()
            }
            self._deadlines = (self.policy, deadlines)
        return deadlines[qos_class]

    def decide(
        self,
        stage: str,
        qos_class: str,
        *,
        run_s: float | None,
        depth: int,
        queue_delay_s: float,
        light_run_s: float | None = None,
    ) -> AdmissionResult:
        """Where a request of ``stage`` goes; :class:`ShedError` (429) to refuse it.

        ``run_s`` is the request's estimated run time on the full variant (None: not judged),
        ``light_run_s`` on the light one; ``depth`` the stage's queued and running tasks,
        ``queue_delay_s`` how long a new one would wait for them.
        """
        spec = self.policy.spec
        has_light = "light" in self.policy.stages[stage].variants
        reason = cause = ""
        if run_s is not None:
            decision = self.breaker(stage).decide(
                run_s,
                queue_delay_s,
                self.deadline_s(qos_class),
                light_run_s=(light_run_s if light_run_s is not None else run_s)
                if has_light
                else None,
                busy=depth > 0,
            )
            if decision.action is Admission.SHED:
                raise ShedError(decision.reason, status=429, retry_after_s=decision.retry_after_s)
            if decision.action is Admission.DEGRADE:
                reason, cause = decision.reason, "complexity"
        if depth >= spec.server.degrade_queue_depth:
            reason = f"queue depth {depth} >= {spec.server.degrade_queue_depth}"
            cause = "queue"
        if reason and has_light:
            return AdmissionResult("light", reason, cause)
        return AdmissionResult("full")
