"""Admission of requests: the variant each stage of a request runs (its estimated run time at
the stage's measured pace against its class's deadline, behind the work queued and running),
the principal's fair share of each stage, and when a refused caller should try again."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hetero.framework.errors import (
    ShedError,
)
from hetero.framework.scheduler import (
    RequestProfile,
)

if TYPE_CHECKING:
    from hetero.framework.engine.engine import Engine

__all__ = ["Admitter"]

logger = logging.getLogger(__name__)


class Admitter:
    """Decides, for the engine, whether and how a request's stages run."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def admit(
        self,
        stage: str,
        qos_class: str | None,
        profile: RequestProfile | None,
        *,
        items: int = 1,
        principal: Any = None,
    ) -> tuple[str, str]:
        """The variant a request of ``stage`` runs (``full``, or ``light`` with the reason).

        The request (``items`` inputs, ``profile`` if stated) is estimated at the stage's
        measured pace and judged against its class's deadline behind the work queued; a named
        ``principal`` must also be within its fair share of the stage's queue.

        Raises:
            ShedError: (429, with Retry-After) it cannot finish by its deadline behind the
                queue, or its principal already holds its share of the stage.
        """
        qos = qos_class or self.engine.policy.spec.qos.default_class
        units = self.units(profile)
        with self.engine._lock:
            self.check_share(stage, qos, principal)
            status = self.engine.status.get(stage)
            variants = self.engine.policy.spec.stages[stage].variants
            run_s = light_s = None
            if status is not None:
                run_s = status.pace("full").estimate_s(items, units)
                if "light" in variants:
                    light_s = status.pace("light").estimate_s(items, units)
            try:
                result = self.engine.admission.decide(
                    stage,
                    qos,
                    run_s=run_s,
                    light_run_s=light_s,
                    depth=self.engine.scheduler.queued(stage) + self.engine._running.get(stage, 0),
                    queue_delay_s=self.queue_delay_s(stage),
                )
            except ShedError:
                self.engine.metrics.shed.labels(stage, "complexity").inc()
                raise
        if result.variant == "light":
            self.engine.metrics.degraded.labels(stage, result.cause).inc()
            if stage in self.engine.status:
                self.engine.status[stage].light_runs += 1
        return result.variant, result.reason

    def max_batch(self, stage: str, variant: str = "full") -> int:
        """The most items one model call of a stage variant takes."""
        with self.engine._lock:
            return self.engine.scheduler.batching_for(f"{stage}/{variant}")[0]

    def units(self, profile: RequestProfile | None) -> float:
        weights = self.engine.policy.spec.circuit_breaker.complexity
        return profile.score(weights) if profile is not None else 0.0

    def check_share(self, stage: str, qos: str, principal: Any) -> None:
        """:class:`ShedError` (429) when ``principal`` holds its share of ``stage`` (lock
        held)."""
        who = getattr(principal, "name", None)
        if who is None:
            return
        bound = self.engine.policy.spec.qos.classes[qos].queue_bound
        held, share = (
            self.engine._shares.held(stage, who),
            self.engine._shares.share(stage, who, bound),
        )
        if held >= share:
            self.engine.metrics.shed.labels(stage, "fair_share").inc()
            pace = (
                self.engine.status[stage].pace("full").item_s
                if stage in self.engine.status
                else 0.0
            )
            raise ShedError(
                f"{who} already has {held} requests of stage {stage!r} waiting or running, its"
                f" share of the {qos!r} queue while others use it",
                status=429,
                retry_after_s=max(self.engine.policy.spec.server.retry_after_s, held * pace),
            )

    def queue_delay_s(self, stage: str) -> float:
        """How long a new task of ``stage`` waits: the work queued and running, at the
        measured pace, by items and by complexity units, whichever says longer (generations
        of 4 and of 400 tokens are one item each; units tell them apart), over the runs a
        device takes at once (lock held)."""
        status = self.engine.status.get(stage)
        if status is None:
            return 0.0
        pace = status.pace("full")
        items = self.engine.scheduler.queued_items(stage) + self.engine._running_items.get(stage, 0)
        units = self.engine.scheduler.queued_units(stage) + self.engine._running_units.get(
            stage, 0.0
        )
        return max(items * pace.item_s, units * pace.unit_s) / self.engine.scheduler.run_slots(
            stage
        )

    def retry_after_s(self, stage: str) -> float:
        """When a refused caller should try again: the stage's queue at its measured pace."""
        with self.engine._lock:
            delay = self.queue_delay_s(stage)
        return max(self.engine.policy.spec.server.retry_after_s, delay)

    def profile(self, stage: str, payload: Any) -> RequestProfile | None:
        try:
            return self.engine.plugins[stage].profile(payload)
        except Exception as err:  # a payload it cannot measure is judged by the run itself
            logger.debug("stage %s: no profile: %s", stage, err)
            return None
