"""One bounded priority queue and its worker threads per stage.

A light stage is never stuck behind a saturated heavy one: each stage has its own queue and
threads, and model calls run in those threads, never on the event loop. Jobs are ordered by
QoS weight plus waiting-time aging (the key ``weight - aging * arrival`` of
:mod:`hetero.framework.scheduler.queues`); a full queue sheds at once. A batchable stage's
worker takes what is queued (same variant, up to ``max_batch``, waiting at most
``max_delay_s`` for more) and makes one model call.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from hetero.framework.errors import QueueFullError
from hetero.framework.server.metrics import ServerMetrics

CLOSE_JOIN_S = 30.0  # how long close() waits for a running batch

__all__ = ["BatchCall", "Job", "StageWorkers"]

logger = logging.getLogger(__name__)

BatchCall = Callable[[str, Sequence[Any]], Sequence[Any]]
"""``call(variant, payloads) -> results`` (one per payload, or an exception instance)."""


@dataclass(eq=False)
class Job:
    """One item of work for a stage."""

    payload: Any
    variant: str
    qos_class: str
    arrival: float
    future: Future[Any] = field(default_factory=Future)
    cancelled: bool = False


class StageWorkers:
    """The queue and threads of one stage."""

    def __init__(
        self,
        stage: str,
        call: BatchCall,
        *,
        weights: Mapping[str, float],
        aging_per_second: float,
        bound: int,
        class_bounds: Mapping[str, int],
        threads: int = 1,
        max_batch: Mapping[str, int] | None = None,
        max_delay_s: float = 0.0,
        metrics: ServerMetrics | None = None,
        runtime_label: str = "",
        nice: int = 0,
    ) -> None:
        self.stage = stage
        self.nice = nice
        self.runtime_label = runtime_label
        self._call = call
        self._weights = dict(weights)
        self._aging = aging_per_second
        self._bound = bound
        self._class_bounds = dict(class_bounds)
        self._max_batch = dict(max_batch or {})
        self._max_delay_s = max_delay_s
        self._metrics = metrics
        self._heap: list[tuple[float, int, Job]] = []
        self._counts: dict[str, int] = {}
        self._sequence = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self.busy = 0
        self.batches = 0
        self.recent_s: collections.deque[float] = collections.deque(maxlen=4096)  # per batch
        self._running: list[Job] = []
        self._threads = [
            threading.Thread(target=self._loop, name=f"hetero-{stage}-{i}", daemon=True)
            for i in range(threads)
        ]
        if metrics is not None:
            metrics.queue_depth.labels(stage).set_function(lambda: len(self))
        for thread in self._threads:
            thread.start()

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def depth(self) -> int:
        """Queued plus running jobs."""
        return len(self._heap) + self.busy

    def submit(self, payload: Any, variant: str, qos_class: str) -> Job:
        """Queue a job; :class:`QueueFullError` when the stage or the class is at its bound."""
        job = Job(payload, variant, qos_class, time.monotonic())
        with self._cond:
            if self._closed:
                raise QueueFullError(self.stage, qos_class, 0)
            class_bound = min(self._bound, self._class_bounds.get(qos_class, self._bound))
            if len(self._heap) >= self._bound or self._counts.get(qos_class, 0) >= class_bound:
                raise QueueFullError(self.stage, qos_class, class_bound)
            key = self._weights.get(qos_class, 1.0) - self._aging * job.arrival
            heapq.heappush(self._heap, (-key, next(self._sequence), job))
            self._counts[qos_class] = self._counts.get(qos_class, 0) + 1
            self._cond.notify()
        return job

    def _pop(self) -> Job:
        job = heapq.heappop(self._heap)[2]
        self._counts[job.qos_class] -= 1
        return job

    def _take(self) -> list[Job] | None:
        with self._cond:
            while not self._heap and not self._closed:
                self._cond.wait()
            if self._closed and not self._heap:
                return None
            first = self._pop()
            batch = [first]
            limit = self._max_batch.get(first.variant, 1)
            deadline = time.monotonic() + self._max_delay_s
            while len(batch) < limit:
                if not self._heap:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._closed:
                        break
                    self._cond.wait(left)
                    continue
                if self._heap[0][2].variant != first.variant:
                    break
                batch.append(self._pop())
            self.busy += 1
            return batch

    def _loop(self) -> None:
        if self.nice:
            # Linux schedules threads as tasks: a heavy stage's workers yield the CPU to light
            # stages and to the HTTP loop without a queue of their own having to wait.
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except OSError as err:
                logger.warning("stage %s: cannot lower worker priority: %s", self.stage, err)
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                self._run(batch)
            finally:
                with self._cond:
                    self.busy -= 1

    def _run(self, batch: list[Job]) -> None:
        live = [
            job for job in batch if not job.cancelled and job.future.set_running_or_notify_cancel()
        ]
        if not live:
            return
        with self._cond:
            self._running.extend(live)
        try:
            self._run_live(live)
        finally:
            with self._cond:
                for job in live:
                    self._running.remove(job)

    def _run_live(self, live: list[Job]) -> None:
        started = time.monotonic()
        if self._metrics is not None:
            for job in live:
                self._metrics.queue_wait.labels(self.stage).observe(started - job.arrival)
        variant = live[0].variant
        try:
            results = list(self._call(variant, [job.payload for job in live]))
        except BaseException as err:  # a batch failing fails each of its jobs, not the worker
            results = [err] * len(live)
        elapsed = time.monotonic() - started
        self.batches += 1
        self.recent_s.append(elapsed)
        if self._metrics is not None:
            self._metrics.stage_duration.labels(self.stage, self.runtime_label, variant).observe(
                elapsed
            )
            self._metrics.batch_size.labels(self.stage).observe(len(live))
        for job, result in zip(live, results, strict=True):
            if isinstance(result, BaseException):
                job.future.set_exception(result)
            else:
                job.future.set_result(result)

    def close(self) -> None:
        """Stop taking jobs; queued jobs are failed; running generations are asked to stop
        (their ``stop`` event), and running ones finish."""
        with self._cond:
            self._closed = True
            pending = [entry[2] for entry in self._heap]
            self._heap.clear()
            running = list(self._running)
            self._cond.notify_all()
        for job in pending:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(QueueFullError(self.stage, job.qos_class, 0))
        for job in running:
            stop = getattr(job.payload, "stop", None)
            if isinstance(stop, threading.Event):
                stop.set()
        for thread in self._threads:
            thread.join(timeout=CLOSE_JOIN_S)

    @property
    def stopped(self) -> bool:
        """Every worker thread has ended (the model is no longer in use)."""
        return not any(thread.is_alive() for thread in self._threads)
