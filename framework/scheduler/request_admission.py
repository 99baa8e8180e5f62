"""Admission of a request's stages: one model for the engine (live requests, measured run
times) and the simulator (virtual requests, modelled run times).

For each stage a request needs, in order:

1. its principal's fair share of the stage (:class:`Shares`): no caller holds more than its
   share of a stage's queue while others use it;
2. its estimated run time at the stage's pace (:class:`Pace`, seconds per item and per
   complexity unit, folded from the stage's own completed batches and seeded by the warm-up's
   probe) judged against its class's deadline behind the stage's queued and running work
   (:class:`StageAdmission`: full, degraded to light, or shed with a Retry-After).

The caller supplies only what differs between a server and a simulation: the run times it
observes (:meth:`RequestAdmission.observe`) and when tasks start and end running
(:meth:`~RequestAdmission.started`, :meth:`~RequestAdmission.finished`). So `hetero tune` tunes
the admission the server runs.
"""

from __future__ import annotations

import numpy as np

from hetero.framework.errors import ShedError
from hetero.framework.policy import Policy
from hetero.framework.request_profile import RequestProfile
from hetero.framework.scheduler.admission import AdmissionResult, StageAdmission
from hetero.framework.scheduler.pacing import Pace, Shares
from hetero.framework.scheduler.scheduler import Scheduler
from hetero.framework.scheduler.sequence_admission import sequence_completion_s
from hetero.framework.scheduler.tasks import StageTask

__all__ = ["FairShareError", "RequestAdmission"]


class FairShareError(ShedError):
    """The principal already holds its share of a stage's queue (429)."""


class RequestAdmission:
    """Fair shares, paces and running work per stage, and the decision built on them.

    Not thread-safe: the engine calls it under its lock, the simulator from its one loop.
    """

    def __init__(self, policy: Policy, scheduler: Scheduler) -> None:
        self.stages = StageAdmission(policy)
        self.scheduler = scheduler
        self.shares = Shares()
        self._paces: dict[tuple[str, str], Pace] = {}
        self._running: dict[str, list[float]] = {}  # stage -> [tasks, items, units]
        self._slots: dict[tuple[str, bytes, bytes], int] = {}  # run_slots, by fleet state

    @property
    def policy(self) -> Policy:
        """The policy it judges by (replaced on a reload)."""
        return self.stages.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.stages.policy = policy

    def qos_class(self, qos_class: str | None) -> str:
        """The QoS class a request runs in: ``qos_class``, or the policy's default.

        Raises:
            KeyError: the policy has no such class.
        """
        classes = self.policy.spec.qos.classes
        qos = qos_class or self.policy.spec.qos.default_class
        if qos not in classes:
            raise KeyError(f"unknown QoS class {qos!r} (classes: {', '.join(sorted(classes))})")
        return qos

    def deadline_s(self, qos_class: str) -> float:
        """The deadline of a QoS class, in seconds."""
        return self.stages.deadline_s(qos_class)

    def units(self, profile: RequestProfile | None) -> float:
        """A profile's complexity units under the policy's weights (0 when unknown)."""
        return profile.score(self.policy.spec.circuit_breaker.complexity) if profile else 0.0

    # --- what the caller observes ---------------------------------------------------------------

    def pace(self, stage: str, variant: str = "full") -> Pace:
        """The pace of a stage variant (made on first use)."""
        key = (stage, variant)
        pace = self._paces.get(key)
        if pace is None:
            pace = self._paces[key] = Pace()
        return pace

    def observe(self, stage: str, variant: str, run_s: float, items: int, units: float) -> None:
        """A batch of ``stage`` ran: fold its time into the variant's pace."""
        self.pace(stage, variant).observe(run_s, items, units)

    def started(self, task: StageTask) -> None:
        """A task of the stage was handed to a device."""
        running = self._running.get(task.stage)
        if running is None:
            running = self._running[task.stage] = [0.0, 0.0, 0.0]
        running[0] += 1
        running[1] += task.items
        running[2] += task.units

    def finished(self, task: StageTask) -> None:
        """A task handed to a device ended (ran, failed or was skipped)."""
        running = self._running.get(task.stage)
        if running is not None:
            running[0] = max(0.0, running[0] - 1)
            running[1] = max(0.0, running[1] - task.items)
            running[2] = max(0.0, running[2] - task.units)

    def running(self, stage: str) -> int:
        """Tasks of ``stage`` running on devices now."""
        running = self._running.get(stage)
        return int(running[0]) if running is not None else 0

    def reset_stage(self, stage: str) -> None:
        """Forget a stage's running work (it was unloaded or reloaded)."""
        self._running.pop(stage, None)

    # --- the decision ---------------------------------------------------------------------------

    def admit(
        self,
        stage: str,
        qos_class: str,
        *,
        items: int = 1,
        units: float = 0.0,
        principal: str | None = None,
        sequence: StageTask | None = None,
    ) -> AdmissionResult:
        """The variant a request of ``stage`` runs (``items`` inputs, ``units`` of complexity).

        ``sequence``: for a continuously batched LLM stage, the sequence the request would
        place (its prompt and a short output length): where the placement can say when it
        would finish (:func:`sequence_completion_s`: a device has room for it now), it is
        also shed when that is past its deadline (a miss whatever follows, which would only
        slow the sequences it joins).

        Raises:
            FairShareError: ``principal`` already holds its share of the stage's queue.
            ShedError: (429, with Retry-After) it cannot finish by its deadline behind the
                stage's queued and running work.
        """
        self.check_share(stage, qos_class, principal)
        full = self._paces.get((stage, "full"))
        light = self._paces.get((stage, "light"))
        variants = self.policy.stages[stage].variants
        result = self.stages.decide(
            stage,
            qos_class,
            run_s=full.estimate_s(items, units) if full is not None else None,
            light_run_s=light.estimate_s(items, units)
            if light is not None and "light" in variants
            else None,
            depth=self.scheduler.queued(stage) + self.running(stage),
            queue_delay_s=self.queue_delay_s(stage),
        )
        if sequence is not None and result.variant == "full":
            now = self.scheduler.clock.now()
            done_in = sequence_completion_s(self.scheduler, sequence, now)
            deadline_s = self.deadline_s(qos_class)
            if done_in is not None and done_in > deadline_s:
                raise ShedError(
                    f"cannot finish by its {deadline_s:g} s deadline: {done_in:.2f} s on the"
                    " device placement would give it now",
                    status=429,
                    retry_after_s=self.policy.spec.server.retry_after_s,
                )
        return result

    def check_share(self, stage: str, qos_class: str, principal: str | None) -> None:
        """:class:`FairShareError` when ``principal`` holds its share of ``stage``."""
        if principal is None:
            return
        bound = self.policy.spec.qos.classes[qos_class].queue_bound
        held = self.shares.held(stage, principal)
        if held < self.shares.share(stage, principal, bound):
            return
        pace = self._paces.get((stage, "full"))
        raise FairShareError(
            f"{principal} already has {held} requests of stage {stage!r} waiting or running,"
            f" its share of the {qos_class!r} queue while others use it",
            status=429,
            retry_after_s=max(
                self.policy.spec.server.retry_after_s,
                held * (pace.item_s if pace is not None else 0.0),
            ),
        )

    def queue_delay_s(self, stage: str) -> float:
        """How long a new task of ``stage`` waits for a place to run.

        With ``n`` tasks queued and running and ``s`` runs at once (:meth:`run_slots`), it
        starts after ``n - s + 1`` of them end, and they end ``s`` at a time: that share of
        the work ahead at the stage's pace (by items and by complexity units, whichever says
        longer: generations of 4 and of 400 tokens are one item each, units tell them apart),
        over ``s``. One run at a time waits for all of it; a continuous batch with room, for
        none."""
        pace = self._paces.get((stage, "full"))
        if pace is None:
            return 0.0
        scheduler = self.scheduler
        running = self._running.get(stage)
        tasks = scheduler.queued(stage) + (running[0] if running is not None else 0.0)
        slots = self.run_slots(stage)
        if tasks < slots:
            return 0.0
        items = scheduler.queued_items(stage) + (running[1] if running is not None else 0.0)
        units = scheduler.queued_units(stage) + (running[2] if running is not None else 0.0)
        ahead = (tasks - slots + 1) / tasks
        return ahead * max(items * pace.item_s, units * pace.unit_s) / slots

    def run_slots(self, stage: str) -> int:
        """Runs of ``stage`` the healthy devices take at once: each device's slots (more than
        one where its runtime batches continuously), a compute resource counted once (the
        runtimes over one host's cores take turns on them)."""
        scheduler = self.scheduler
        tables = scheduler.tables[f"{stage}/full"]
        key = (stage, scheduler.healthy.tobytes(), tables.slots.tobytes())
        known = self._slots.get(key)
        if known is not None:  # asked per request: health and slots rarely move
            return known
        runnable = tables.costs.runnable & scheduler.healthy
        slots = tables.slots[runnable]
        if len(slots) <= 1:
            count = int(slots[0]) if len(slots) else 1
        else:
            groups = scheduler._compute_group[runnable]  # the scheduler's, kept as devices join
            most = np.zeros(int(groups.max()) + 1, dtype=np.int64)
            np.maximum.at(most, groups, slots)
            count = max(1, int(most.sum()))
        if len(self._slots) >= 64:  # bounded: a flapping fleet does not grow it
            self._slots.clear()
        self._slots[key] = count
        return count

    def retry_after_s(self, stage: str) -> float:
        """When a refused caller should try again: the stage's queue at its pace."""
        return max(self.policy.spec.server.retry_after_s, self.queue_delay_s(stage))
