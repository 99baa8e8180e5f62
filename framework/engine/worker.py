"""One worker thread per device: batches dispatched tasks, keeps models loaded, runs them."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetero.framework.backend import Backend, LoadedModel
from hetero.framework.devices import DeviceSpec
from hetero.framework.graph import ComputeGraph
from hetero.framework.scheduler import Batcher, Dispatch

__all__ = ["BatchOutcome", "DeviceWorker"]

logger = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray[Any, Any]]
IDLE_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What happened to one dispatched task of a batch.

    ``skipped`` marks a task whose request was cancelled before it ran: it did not run, and its
    device is not to blame.
    """

    dispatch: Dispatch
    outputs: Arrays | None
    error: BaseException | None
    run_s: float
    batch_size: int
    started_at: float
    skipped: bool = False


class DeviceWorker:
    """Runs one device's batches on its own thread; nothing it meets kills the thread."""

    def __init__(
        self,
        device: DeviceSpec,
        backend: Backend,
        graph_for: Callable[[str], ComputeGraph],
        inputs_for: Callable[[Dispatch], Arrays | None],
        batching_for: Callable[[str], tuple[int, float]],
        report: Callable[[list[BatchOutcome]], None],
    ) -> None:
        self.device = device
        self.backend = backend
        self._graph_for = graph_for
        self._inputs_for = inputs_for
        self._batching_for = batching_for
        self._report = report
        self.inbox: queue.Queue[Dispatch | None] = queue.Queue()
        self._batchers: dict[str, Batcher[Dispatch]] = {}
        self.loaded: dict[str, LoadedModel] = {}
        self._thread = threading.Thread(target=self._loop, name=f"hetero-{device.id}", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self) -> None:
        """Finish what is queued, unload everything, end the thread."""
        self.inbox.put(None)
        self._thread.join()
        for model in list(self.loaded.values()):
            self.backend.unload(model)
        self.loaded.clear()

    def _timeout(self) -> float:
        due = [d for b in self._batchers.values() if (d := b.due_at()) is not None]
        return max(0.0, min(due) - time.monotonic()) if due else IDLE_POLL_S

    def _loop(self) -> None:
        running = True
        while running or any(len(b) for b in self._batchers.values()):
            if running:
                running = self._receive(self._timeout())
            now = time.monotonic()
            for batcher in list(self._batchers.values()):
                batch = batcher.take(now)
                if not batch:
                    continue
                try:
                    outcomes = self._execute(batch)
                except Exception as err:  # a bug here must fail the batch, not the thread
                    logger.exception("%s: batch failed unexpectedly", self.device.id)
                    outcomes = [BatchOutcome(d, None, err, 0.0, len(batch), now) for d in batch]
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
            self._evict(item)
            self._batcher(item.model_key).add(item, time.monotonic())
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return True

    def _evict(self, dispatch: Dispatch) -> None:
        """Carry out the plan's evictions in dispatch order (victims have no work queued)."""
        for victim in dispatch.load.evict:
            model = self.loaded.pop(victim, None)
            if model is not None:
                try:
                    self.backend.unload(model)
                except Exception:
                    logger.exception("%s: unloading %s failed", self.device.id, victim)

    def _batcher(self, key: str) -> Batcher[Dispatch]:
        if key not in self._batchers:
            max_batch, max_delay_s = self._batching_for(key)
            self._batchers[key] = Batcher(max_batch=max_batch, max_delay_s=max_delay_s)
        return self._batchers[key]

    def _model(self, model_key: str) -> LoadedModel:
        model = self.loaded.get(model_key)
        if model is None:
            graph = self._graph_for(model_key)
            model = self.backend.load(self.backend.compile(graph, self.device.id))
            self.loaded[model_key] = model
        return model

    def _execute(self, batch: list[Dispatch]) -> list[BatchOutcome]:
        started = time.monotonic()
        outcomes: list[BatchOutcome] = []
        live: list[tuple[Dispatch, Arrays]] = []
        for dispatch in batch:
            arrays = self._inputs_for(dispatch)
            if arrays is None:
                outcomes.append(BatchOutcome(dispatch, None, None, 0.0, 0, started, skipped=True))
            else:
                live.append((dispatch, arrays))
        if not live:
            return outcomes
        try:
            model = self._model(batch[0].model_key)
        except Exception as err:  # a failed load fails the batch; the engine retries elsewhere
            logger.warning("%s: loading %s failed: %s", self.device.id, batch[0].model_key, err)
            return outcomes + [BatchOutcome(d, None, err, 0.0, len(live), started) for d, _ in live]
        stacked = _stack([arrays for _, arrays in live]) if len(live) > 1 else None
        if stacked is not None:
            arrays, sizes = stacked
            try:
                result = self.backend.run(model, arrays)
            except Exception as err:
                logger.info("%s: stacked run failed (%s); running items alone", self.device.id, err)
            else:
                parts = _split(result.outputs, sizes)
                return outcomes + [
                    BatchOutcome(d, part, None, result.latency_s, len(live), started)
                    for (d, _), part in zip(live, parts, strict=True)
                ]
        for dispatch, arrays in live:
            try:
                result = self.backend.run(model, arrays)
                outcomes.append(
                    BatchOutcome(dispatch, result.outputs, None, result.latency_s, 1, started)
                )
            except Exception as err:
                outcomes.append(BatchOutcome(dispatch, None, err, 0.0, 1, started))
        return outcomes


def _stack(inputs: list[Arrays]) -> tuple[Arrays, list[int]] | None:
    """Concatenate items along axis 0 when every input of every item has at least one
    dimension, the same names, the same trailing shape and one leading size per item."""
    names = inputs[0].keys()
    if not names or any(item.keys() != names for item in inputs):
        return None
    if any(np.ndim(item[name]) == 0 for item in inputs for name in names):
        return None
    for name in names:
        if len({np.shape(item[name])[1:] for item in inputs}) != 1:
            return None
    sizes = [int(np.shape(item[next(iter(names))])[0]) for item in inputs]
    for name in names:
        if [int(np.shape(item[name])[0]) for item in inputs] != sizes:
            return None
    return {name: np.concatenate([item[name] for item in inputs]) for name in names}, sizes


def _split(outputs: Arrays, sizes: list[int]) -> list[Arrays]:
    total = sum(sizes)
    bounds = np.cumsum([0, *sizes])
    parts: list[Arrays] = [{} for _ in sizes]
    for name, value in outputs.items():
        array = np.asarray(value)
        for index in range(len(sizes)):
            if array.ndim and array.shape[0] == total:
                parts[index][name] = array[bounds[index] : bounds[index + 1]]
            else:
                parts[index][name] = array  # not batched along axis 0: every item sees it whole
    return parts
