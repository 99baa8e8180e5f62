"""Dispatch: placement runs on the calling thread whenever a task arrives or a device frees up
(the dispatcher thread only retries on a timer), each placed task goes to the lane of its
(stage, device), and finished batches feed paces, metrics and device health."""

from __future__ import annotations

import logging
from collections import Counter
from functools import partial
from typing import TYPE_CHECKING, Any

from hetero.framework.engine.lanes import (
    BatchOutcome,
    Lane,
)
from hetero.framework.engine.thread_budget import narrows
from hetero.framework.scheduler import (
    Dispatch,
    Rejection,
)

if TYPE_CHECKING:
    from hetero.framework.engine.engine import Engine

__all__ = ["Dispatcher"]

logger = logging.getLogger(__name__)
DISPATCH_POLL_S = 0.05


class Dispatcher:
    """Places queued tasks and hands them to lanes."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def kick(self) -> None:
        """Place what can go now, on this thread: a new task or a freed device is dispatched
        without a hand-off to the dispatcher thread (which only retries on a timer)."""
        if self.engine._stopping or not self.engine._started:
            self.engine._wake.set()
            return
        try:
            self.dispatch_ready()
        except Exception:  # a bug here must not fail the caller's request or the lane
            logger.exception("dispatch failed unexpectedly")
            self.engine._wake.set()

    def loop(self) -> None:
        while not self.engine._stopping:
            self.engine._wake.wait(timeout=DISPATCH_POLL_S)
            self.engine._wake.clear()
            try:
                self.dispatch_ready()
            except Exception:  # a bug here must not stop dispatching for everyone
                logger.exception("dispatch failed unexpectedly")

    def membership_loop(self) -> None:
        """Ask backends whose devices come and go (a Ray cluster's nodes) every
        ``cluster.heartbeat_s``: devices that joined are taken in, those that left leave
        placement, without anyone calling :meth:`add_devices`."""
        while not self.engine._wake_membership.wait(
            timeout=self.engine.policy.spec.cluster.heartbeat_s
        ):
            self.poll_membership()  # the event is set only when closing

    def poll_membership(self) -> None:
        for backend in list(self.engine.backends.values()):
            if not backend.supports_membership:
                continue
            try:
                joined = backend.poll_membership()
            except Exception:  # a heartbeat that fails is tried again on the next beat
                logger.exception("%s: polling membership failed", backend.name)
                continue
            if joined:
                logger.info("%d devices joined: %s", len(joined), [d.id for d in joined])
                self.engine.add_devices(joined)
        self.sync_health()
        self.kick()

    def dispatch_ready(self) -> None:
        outcomes: list[Dispatch | Rejection] = []
        with self.engine._lock:
            while (outcome := self.engine.scheduler.dispatch()) is not None:
                outcomes.append(outcome)
                if isinstance(outcome, Dispatch):
                    self.engine.admission.started(outcome.task)
        # a lane that gets one task of this round may start it from this thread; several go
        # through its inbox, for its thread to batch them as it did (Lane.offer)
        per_lane = Counter((o.task.stage, o.device_id) for o in outcomes if isinstance(o, Dispatch))
        for outcome in outcomes:
            if isinstance(outcome, Rejection):
                self.engine.outcomes.fail(outcome.task.request_id, outcome.error)
                continue
            stage, device_id = outcome.task.stage, outcome.device_id
            self.engine.metrics.placements.labels(stage, device_id).inc()
            if outcome.load.load:
                self.engine.metrics.loads.labels(stage, device_id).inc()
            for victim in outcome.load.evict:
                self.engine.metrics.evictions.labels(victim.split("/", 1)[0], device_id).inc()
            lane = self.lane(stage, device_id)
            if per_lane[(stage, device_id)] == 1:
                lane.offer(outcome)
            else:
                lane.inbox.put(outcome)

    def lane(self, stage: str, device_id: str) -> Lane:
        with self.engine._lanes_lock:
            lane = self.engine._lanes.get((stage, device_id))
            if lane is None:
                graph_format = self.engine.format_for(stage, device_id)
                assert graph_format is not None, "the scheduler placed where it cannot run"
                device = self.engine._device_by_id[device_id]
                threads = self.engine._threads.get(stage, 0)
                scheduler = self.engine.scheduler
                # on the host's cores: fewer threads while contended, a batch per thread
                # side by side while nothing else runs there (:mod:`.thread_budget`)
                shares_cores = narrows(device, threads)
                lane = Lane(
                    stage,
                    self.engine.plugins[stage],
                    graph_format,
                    self.engine.models[device_id],
                    threads,
                    self.inputs,
                    scheduler.batching_for,
                    self.on_batch,
                    nice=self.engine._nice.get(stage, 0),
                    slots=self.engine.backends[device.backend].run_slots(device_id, graph_format),
                    contended=partial(scheduler.cores_contended, device_id)
                    if shares_cores
                    else None,
                    core_slots=threads if shares_cores else 1,
                )
                self.engine._lanes[(stage, device_id)] = lane
            return lane

    def inputs(self, dispatch: Dispatch) -> tuple[bool, Any]:
        """A task's payload; (False, None) when its request is gone (cancelled, timed out)."""
        task = dispatch.task
        with self.engine._lock:
            state = self.engine._requests.get(task.request_id)
            if state is None or task.cancelled:
                return False, None
            return True, self.engine.runner.step_inputs(state, task.step)

    def on_batch(self, outcomes: list[BatchOutcome]) -> None:
        self.sync_health()  # before a failed task is retried elsewhere
        for outcome in outcomes:
            self.engine.outcomes.finish(outcome)
        # the batch's figures after its requests are answered: they wait for nothing here
        self._observe_batch([o for o in outcomes if not o.skipped and o.batch_size])
        self.kick()

    def _observe_batch(self, ran: list[BatchOutcome]) -> None:
        if not ran:
            return
        first = ran[0]
        device_id = first.dispatch.device_id
        stage = first.dispatch.task.stage
        variant = first.dispatch.model_key.split("/", 1)[1]
        self.engine.metrics.batch_size.labels(stage).observe(first.batch_size)
        self.engine.metrics.stage_duration.labels(stage, device_id, variant).observe(first.run_s)
        self.engine.metrics.device_busy.labels(device_id).inc(first.run_s)
        status = self.engine.status.get(stage)
        if status is not None:
            status.batches += 1
            items = sum(o.dispatch.task.items for o in ran) or 1
            status.recent_s.append(first.run_s / items)
            units = sum(o.dispatch.task.units for o in ran)
            self.engine.admission.observe(stage, variant, first.run_s, items, units)

    def sync_health(self) -> None:
        """Devices their backend marked unhealthy (or healthy again) leave (or rejoin)
        placement; checked after every batch, so a fault seen anywhere applies at once."""
        with self.engine._lock:
            for index, device in enumerate(self.engine.fleet.devices):
                healthy = self.engine.backends[device.backend].health(device.id) is None
                if bool(self.engine.scheduler.healthy[index]) != healthy:
                    self.engine.scheduler.set_health(device.id, healthy)
