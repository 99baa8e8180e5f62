"""Admission of requests as the engine asks it: the shared
:class:`~hetero.framework.scheduler.request_admission.RequestAdmission` (the simulator runs the
same) under the engine's lock, with its decisions counted in the engine's metrics, and each
stage plugin's profile of its input."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

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
        sequence as :meth:`sequence` makes it (judged by where it would finish).

        Raises:
            ShedError: (429, with Retry-After) it cannot finish by its deadline behind the
                queue, or its principal already holds its share of the stage.
        """
        engine = self.engine
        qos = qos_class or engine.policy.spec.qos.default_class
        who = getattr(principal, "name", None)
        with engine._lock:
            try:
                result = engine.admission.admit(
                    stage,
                    qos,
                    items=items,
                    units=self.units(profile),
                    principal=None if who is None else str(who),
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

    def sequence(self, stage: str, payload: Any, qos_class: str) -> StageTask | None:
        """The sequence a generation would place in ``stage`` (a continuously batched
        KV-cache model), as admission judges it where it would finish: its prompt and the
        length nine in ten of the stage's recent generations reach (the simulator makes the
        same); None for any other stage, or before a generation finished."""
        engine = self.engine
        tables = engine.scheduler.tables.get(f"{stage}/full")
        if tables is None or not tables.costs.hint.kv_bytes_per_token:
            return None
        short = engine.scheduler.output_lengths.short(stage)
        kv_tokens = engine.plugins[stage].kv_tokens(payload, short) if short else 0
        if not kv_tokens:
            return None
        now = engine.clock.now()
        return StageTask(
            request_id="admission",
            stage=stage,
            step=stage,
            variant="full",
            qos_class=qos_class,
            arrival=now,
            deadline=now + engine.admission.deadline_s(qos_class),
            kv_tokens=kv_tokens,
            output_tokens=short,
            id=0,
        )

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
