"""Device lanes: one worker thread per (stage, device), so a heavy stage never blocks a light
one. The graphs resident on each device are :mod:`.device_models`'.

A lane receives the scheduler's dispatches for its stage on its device, carries out the
memory manager's evictions, batches what is queued (per variant, up to the scheduler's batch
size and delay), makes the stage's graphs resident if they are not, and runs the batch through
the stage plugin with that device's runner. Nothing a plugin raises kills the thread.

A device whose runtime takes several runs at once (``Backend.run_slots``: a vLLM engine with
continuous batching) gets a lane with as many slots: each batch then runs on a slot thread of
its own while the lane goes on receiving, so a generation that arrives joins the ones already
running instead of waiting for them to end.

A stage on the host's cores whose runs can be narrowed (:mod:`.thread_budget`) gets a slot per
intra-op thread it may use (``core_slots``), used only while no other stage has work on those
cores: one batch always runs; while the cores are otherwise free, a batch is split in as many
runs as slots are free, and a task that arrives starts beside the runs already going. On the
two-core bench machine one-thread runs side by side kept their speed alone, about 1.2x the work
of one run with two threads (docs/scheduler.md, "Core slots"). Without the slots, a stage
whose neighbour sat idle ran its narrowed batches on one core while the other idled: the server
used 1.5 of the 2 cores at concurrency 8 against FastAPI's 1.8, and with them 1.6.

A task placed on such a lane while it has nothing queued and a core slot free starts from the
placing thread (:meth:`Lane.offer`), not through the lane's thread: the hand-off to the lane's
thread cost a request about 0.1 ms at concurrency 1, on a path of about 9 ms. A batch that ends
wakes the lane's thread only when tasks wait there for a slot.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from hetero.framework.engine.device_models import ModelHost
from hetero.framework.engine.thread_budget import narrow_threads
from hetero.framework.errors import InputLostError
from hetero.framework.graph import GraphFormat
from hetero.framework.scheduler import Batcher, Dispatch
from hetero.framework.stage_plugin import StagePlugin

__all__ = ["BatchOutcome", "Lane", "split_batch"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

IDLE_POLL_S = 0.5


class _Wake:
    """Put in a lane's inbox when a batch ends on a core slot: queued work may start now."""


_WAKE = _Wake()


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What happened to one dispatched task of a batch.

    ``error`` set and ``blame`` true: the device failed (the engine retries elsewhere);
    ``blame`` false: the item itself was bad (its request fails, the device is not judged).
    ``skipped`` marks a task whose request was cancelled before it ran.
    """

    dispatch: Dispatch
    output: Any
    error: BaseException | None
    run_s: float
    batch_size: int  # nominal items of the whole batch (the cost hint's unit), not tasks
    started_at: float
    blame: bool = True
    skipped: bool = False
    load_s: float = 0.0  # the model load this batch waited for (0: it was resident)


class Lane:
    """One (stage, device): a thread running that stage's batches on that device."""

    def __init__(
        self,
        stage: str,
        plugin: StagePlugin,
        graph_format: GraphFormat,
        models: ModelHost,
        threads: int,
        inputs_for: Callable[[Dispatch], tuple[bool, Any]],
        batching_for: Callable[[str], tuple[int, float]],
        report: Callable[[list[BatchOutcome]], None],
        nice: int = 0,
        slots: int = 1,
        contended: Callable[[int], bool] | None = None,
        core_slots: int = 1,
    ) -> None:
        if slots < 1 or core_slots < 1:
            raise ValueError(f"a lane needs at least one slot, got {slots} and {core_slots}")
        self.stage = stage
        self.nice = nice
        self.slots = slots
        # batches run side by side on the host's cores while nothing else is in flight there
        # (``contended(own tasks)`` false); 1: one at a time
        self.core_slots = core_slots if contended is not None else 1
        self._busy = 0  # batches running on core slots
        self._busy_tasks = 0  # their tasks
        self._stopping = False
        self.running: dict[int, Any] = {}  # payloads of the batches being run, by id, for stop()
        self._running_lock = threading.Lock()
        self.plugin = plugin
        self.graph_format = graph_format
        self.models = models
        self.device = models.device
        self.threads = threads
        # whether other work shares the cores with a batch of n tasks; None: never narrowed
        self._contended = contended
        self._inputs_for = inputs_for
        self._batching_for = batching_for
        self._report = report
        self.inbox: queue.SimpleQueue[Dispatch | _Wake | None] = queue.SimpleQueue()
        self._batchers: dict[str, Batcher[Dispatch]] = {}
        workers = max(slots, self.core_slots)
        self._pool = (
            ThreadPoolExecutor(
                workers,
                thread_name_prefix=f"hetero-{stage}@{self.device.id}",
                initializer=self._lower_priority,
            )
            if workers > 1
            else None
        )
        self._thread = threading.Thread(
            target=self._loop, name=f"hetero-{stage}@{self.device.id}", daemon=True
        )
        self._thread.start()

    def offer(self, dispatch: Dispatch) -> None:
        """Hand a placed task to the lane: on a lane with core slots that has nothing queued,
        no eviction to carry out and a slot free, started at once from this thread on a slot
        (its batch is the task alone, as the lane's thread would have taken it); otherwise put
        in the lane's inbox. A task that its batcher would hold for others to join
        (``max_delay_ms``, and room in ``max_batch``) always goes through the inbox."""
        if self.core_slots > 1 and not dispatch.load.evict and self._start_alone(dispatch):
            return
        self.inbox.put(dispatch)

    def _start_alone(self, dispatch: Dispatch) -> bool:
        batcher = self._batchers.get(dispatch.model_key)  # made by the lane's thread
        if batcher is None or not self.inbox.empty():
            return False
        if batcher.max_delay_s > 0 and _inputs_of(dispatch) < batcher.max_batch:
            return False  # the lane's thread would wait for more to batch with it
        now = time.monotonic()
        with self._running_lock:
            if self._stopping or self.waiting() or self._free_core_slots_locked(1) < 1:
                return False
            self._reserve(1)
        try:
            self._submit_to_core_slot([dispatch], now)
        except RuntimeError:  # the lane is shutting down: its thread settles what is left
            with self._running_lock:
                self._busy -= 1
                self._busy_tasks -= 1
            return False
        return True

    def stop(self) -> None:
        """Finish what is queued, ask a running stream to stop (its ``stop`` event), then end
        the thread."""
        self.inbox.put(None)
        with self._running_lock:
            running = list(self.running.values())
        for payload in running:
            stop = getattr(payload, "stop", None)
            if isinstance(stop, threading.Event):
                stop.set()
        self._thread.join()

    def waiting(self) -> int:
        """Tasks the lane has received and not yet started (read without a lock: a hint)."""
        return sum(len(b) for b in list(self._batchers.values()))

    def _timeout(self) -> float:
        due = [d for b in self._batchers.values() if (d := b.due_at()) is not None]
        if not due or (self.core_slots > 1 and not self._free_core_slots()):
            return IDLE_POLL_S  # no slot free: the end of a core slot's batch wakes the lane
        return max(0.0, min(due) - time.monotonic())

    def _lower_priority(self) -> None:
        if self.nice:
            # Linux schedules threads as tasks: a heavy stage's lanes yield the CPU to light
            # stages and to the HTTP loop without a queue of their own having to wait.
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except OSError as err:
                logger.warning("%s: cannot lower lane priority: %s", self._thread.name, err)

    def _loop(self) -> None:
        self._lower_priority()
        running = True
        while running or any(len(b) for b in self._batchers.values()):
            if running:
                running = self._receive(self._timeout())
                self._stopping = not running
            now = time.monotonic()
            for batcher in list(self._batchers.values()):
                if self.core_slots > 1:
                    self._start_on_core_slots(batcher, now)
                    continue
                batch = batcher.take(now)
                if not batch:
                    continue
                if self._pool is None:
                    self._run_batch(batch, now)
                else:  # the scheduler keeps at most `slots` batches outstanding here
                    self._pool.submit(self._run_batch, batch, now)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _start_on_core_slots(self, batcher: Batcher[Dispatch], now: float) -> None:
        """Start what ``batcher`` has ready on the free core slots: a batch split in as many
        parts as slots are free (and it has tasks), each part a run of its own."""
        while True:
            with self._running_lock:  # the slots counted are the slots taken (offer())
                free = self._free_core_slots_locked()
                batch = batcher.take(now) if free > 0 else []
                parts = split_batch(batch, free) if batch else []
                for part in parts:
                    self._reserve(len(part))
            if not parts:
                return
            for part in parts:
                self._submit_to_core_slot(part, now)

    def _free_core_slots(self) -> int:
        with self._running_lock:
            return self._free_core_slots_locked()

    def _free_core_slots_locked(self, arriving: int = 0) -> int:
        """Batches that may start now on core slots: with none running, one, or one per slot
        while no other stage has work on these cores; beside running ones, the slots left
        while no other stage has work there, else none. Flushing on the way out: one.
        ``arriving``: tasks about to start that the lane has not queued."""
        busy, busy_tasks = self._busy, self._busy_tasks
        if self._stopping:
            return 1
        if busy >= self.core_slots:
            return 0
        assert self._contended is not None
        own = busy_tasks + arriving + self.waiting()
        if self._contended(own):
            return 1 if busy == 0 else 0
        return self.core_slots - busy

    def _reserve(self, tasks: int) -> None:
        """Count a batch of ``tasks`` as running on a core slot (the running lock held)."""
        self._busy += 1
        self._busy_tasks += tasks

    def _submit_to_core_slot(self, batch: list[Dispatch], now: float) -> None:
        assert self._pool is not None
        self._pool.submit(self._run_on_core_slot, batch, now)

    def _run_on_core_slot(self, batch: list[Dispatch], now: float) -> None:
        try:
            self._run_batch(batch, now)
        finally:
            with self._running_lock:
                self._busy -= 1
                self._busy_tasks -= len(batch)
            # tasks that wait for a slot are queued before the lane counts the slots, and
            # the slot is given back before the lane is checked for them: one of the two
            # sees the other's change (a wake-up is needed only for what waits)
            if self.waiting():
                self.inbox.put(_WAKE)

    def _run_batch(self, batch: list[Dispatch], now: float) -> None:
        try:
            outcomes = self._execute(batch)
        except Exception as err:  # a bug here must fail the batch, not the thread
            logger.exception("%s: batch of %s failed unexpectedly", self.device.id, self.stage)
            outcomes = [BatchOutcome(d, None, err, 0.0, _items(batch), now) for d in batch]
        self._report(outcomes)

    def _receive(self, timeout: float) -> bool:
        """Take what arrived (waiting up to ``timeout`` for the first); False once told to stop."""
        try:
            item = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return True
        while True:
            if item is None:
                for batcher in self._batchers.values():
                    batcher.max_delay_s = 0.0  # flush partial batches on the way out
                return False
            if not isinstance(item, _Wake):  # a wake-up only says a core slot is free
                for victim in item.load.evict:  # the memory manager's plan, in dispatch order
                    self.models.evict(victim)
                self._batcher(item.model_key).add(item, time.monotonic())
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return True

    def _batcher(self, key: str) -> Batcher[Dispatch]:
        if key not in self._batchers:
            max_batch, max_delay_s = self._batching_for(key)
            if not self.plugin.batchable:
                max_batch, max_delay_s = 1, 0.0
            self._batchers[key] = Batcher(
                max_batch=max_batch, max_delay_s=max_delay_s, size=_inputs_of
            )
        return self._batchers[key]

    def _execute(self, batch: list[Dispatch]) -> list[BatchOutcome]:
        started = time.monotonic()
        outcomes: list[BatchOutcome] = []
        live: list[tuple[Dispatch, Any]] = []
        for dispatch in batch:
            alive, payload = self._inputs_for(dispatch)
            if alive:
                live.append((dispatch, payload))
            else:
                outcomes.append(BatchOutcome(dispatch, None, None, 0.0, 0, started, skipped=True))
        if not live:
            return outcomes
        model_key = batch[0].model_key
        size = _items(d for d, _ in live)
        payloads = [payload for _, payload in live]
        with self._running_lock:
            self.running.update((id(p), p) for p in payloads)
        threads = self.threads
        if self._contended is not None and self._contended(len(batch)):
            threads = narrow_threads(threads)
        began = time.perf_counter()
        try:
            ran = self.models.run_batch(
                self.plugin, model_key, self.graph_format, threads, payloads
            )
        except InputLostError as err:  # where the inputs lay is gone: not this device's fault
            return outcomes + [
                BatchOutcome(d, None, err, 0.0, size, started, False) for d, _ in live
            ]
        except Exception as err:  # a failed load or run fails the batch; retried elsewhere
            logger.warning("%s: a batch of %s failed: %s", self.device.id, model_key, err)
            run_s = time.perf_counter() - began
            return outcomes + [BatchOutcome(d, None, err, run_s, size, started) for d, _ in live]
        finally:
            with self._running_lock:
                for payload in payloads:
                    self.running.pop(id(payload), None)
        for (dispatch, _), result in zip(live, ran.results, strict=True):
            if isinstance(result, BaseException):  # the item was bad, not the device
                outcome = BatchOutcome(
                    dispatch, None, result, ran.run_s, size, started, False, load_s=ran.load_s
                )
            else:
                outcome = BatchOutcome(
                    dispatch, result, None, ran.run_s, size, started, load_s=ran.load_s
                )
            outcomes.append(outcome)
        return outcomes


def split_batch(batch: list[T], parts: int) -> list[list[T]]:
    """``batch`` in up to ``parts`` runs of consecutive tasks, as even in tasks as they go."""
    parts = max(1, min(parts, len(batch)))
    size, extra = divmod(len(batch), parts)
    out: list[list[T]] = []
    start = 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        out.append(batch[start:end])
        start = end
    return out


def _items(dispatches: Iterable[Dispatch]) -> int:
    """Nominal items of a batch: what the scheduler's cost model counts."""
    return sum(dispatch.task.items for dispatch in dispatches)


def _inputs_of(dispatch: Dispatch) -> int:
    """The model inputs a dispatched task holds (a part of a request holds several)."""
    return max(1, dispatch.task.items)
