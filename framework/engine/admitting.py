"""Admission of requests as the engine asks it: the shared
:class:`~hetero.framework.scheduler.request_admission.RequestAdmission` (the simulator runs the
same) under the engine's lock, with its decisions counted in the engine's metrics, and each
stage plugin's profile of its input."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hetero.framework.engine.request_walk import principal_name
from hetero.framework.errors import ShedError
from hetero.framework.scheduler import RequestProfile, StageTask
from hetero.framework.scheduler.request_admission import FairShareError

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
        sequence: StageTask | None = None,
    ) -> tuple[str, str]:
        """The variant a request of ``stage`` runs (``full``, or ``light`` with the reason):
        the engine's :class:`~hetero.framework.scheduler.request_admission.RequestAdmission`
        (the simulator's too), counted in the engine's metrics. ``sequence``: a generation's
        sequence as the request walk makes it (judged by where it would finish).

        Raises:
            ShedError: (429, with Retry-After) it cannot finish by its deadline behind the
                queue, or its principal already holds its share of the stage.
        """
        engine = self.engine
        qos = qos_class or engine.policy.spec.qos.default_class
        who = principal_name(principal)
        with engine._lock:
            try:
                result = engine.admission.admit(
                    stage,
                    qos,
                    items=items,
                    units=self.units(profile),
                    principal=who,
                    sequence=sequence,
                )
            except FairShareError:
                engine.metrics.shed.labels(stage, "fair_share").inc()
                raise
            except ShedError:
                engine.metrics.shed.labels(stage, "complexity").inc()
                raise
        if result.variant == "light":
            engine.metrics.degraded.labels(stage, result.cause).inc()
            if stage in engine.status:
                engine.status[stage].light_runs += 1
        return result.variant, result.reason

    def max_batch(self, stage: str, variant: str = "full") -> int:
        """The most items one model call of a stage variant takes."""
        with self.engine._lock:
            return self.engine.scheduler.batching_for(f"{stage}/{variant}")[0]

    def units(self, profile: RequestProfile | None) -> float:
        """A profile's complexity units under the policy's weights (0 when unknown)."""
        return self.engine.admission.units(profile)

    def queue_delay_s(self, stage: str) -> float:
        """How long a new task of ``stage`` waits behind the work queued and running (lock
        held)."""
        return self.engine.admission.queue_delay_s(stage)

    def retry_after_s(self, stage: str) -> float:
        """When a refused caller should try again: the stage's queue at its measured pace."""
        with self.engine._lock:
            return self.engine.admission.retry_after_s(stage)

    def profile(self, stage: str, payload: Any) -> RequestProfile | None:
        """The stage plugin's measure of ``payload`` (None when it cannot measure it)."""
        try:
            return self.engine.plugins[stage].profile(payload)
        except Exception as err:  # a payload it cannot measure is judged by the run itself
            logger.debug("stage %s: no profile: %s", stage, err)
            return None
