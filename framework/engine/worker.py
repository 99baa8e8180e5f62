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
    """What happened to one dispatched task of a batch."""

    dispatch: Dispatch
    outputs: Arrays | None
    error: BaseException | None
    run_s: float
    batch_size: int
    started_at: float


class DeviceWorker:
    """Runs one device's batches on its own thread."""

    def __init__(
        self,
        device: DeviceSpec,
        backend: Backend,
        graph_for: Callable[[str], ComputeGraph],
        inputs_for: Callable[[Dispatch], Arrays],
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
        due = [b.due_at() for b in self._batchers.values() if len(b)]
        if not due:
            return IDLE_POLL_S
        return max(0.0, min(d for d in due if d is not None) - time.monotonic())

    def _loop(self) -> None:
        running = True
        while running or any(len(b) for b in self._batchers.values()):
            if running:
                running = self._receive(self._timeout())
            now = time.monotonic()
            for batcher in list(self._batchers.values()):
                batch = batcher.take(now)
                if batch:
                    self._report(self._execute(batch))

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
            self._batcher(item.model_key).add(item, time.monotonic())
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return True

    def _batcher(self, key: str) -> Batcher[Dispatch]:
        if key not in self._batchers:
            max_batch, max_delay_s = self._batching_for(key)
            self._batchers[key] = Batcher(max_batch=max_batch, max_delay_s=max_delay_s)
        return self._batchers[key]

    def _ensure_loaded(self, dispatch: Dispatch) -> LoadedModel:
        for victim in dispatch.load.evict:
            model = self.loaded.pop(victim, None)
            if model is not None:
                self.backend.unload(model)
        model = self.loaded.get(dispatch.model_key)
        if model is None:
            graph = self._graph_for(dispatch.model_key)
            model = self.backend.load(self.backend.compile(graph, self.device.id))
            self.loaded[dispatch.model_key] = model
        return model

    def _execute(self, batch: list[Dispatch]) -> list[BatchOutcome]:
        started = time.monotonic()
        try:
            model = self._ensure_loaded(batch[0])
            for dispatch in batch[1:]:
                self._ensure_loaded(dispatch)  # later dispatches may carry their own evictions
            inputs = [self._inputs_for(d) for d in batch]
        except Exception as err:  # a load that fails fails the whole batch, to be retried
            logger.warning("%s: loading %s failed: %s", self.device.id, batch[0].model_key, err)
            return [BatchOutcome(d, None, err, 0.0, len(batch), started) for d in batch]
        stacked = _stack(inputs) if len(batch) > 1 else None
        if stacked is not None:
            arrays, sizes = stacked
            try:
                result = self.backend.run(model, arrays)
            except Exception as err:
                return [BatchOutcome(d, None, err, 0.0, len(batch), started) for d in batch]
            parts = _split(result.outputs, sizes)
            return [
                BatchOutcome(d, part, None, result.latency_s, len(batch), started)
                for d, part in zip(batch, parts, strict=True)
            ]
        outcomes = []
        for dispatch, arrays in zip(batch, inputs, strict=True):
            try:
                result = self.backend.run(model, arrays)
                outcomes.append(
                    BatchOutcome(dispatch, result.outputs, None, result.latency_s, 1, started)
                )
            except Exception as err:
                outcomes.append(BatchOutcome(dispatch, None, err, 0.0, 1, started))
        return outcomes


def _stack(inputs: list[Arrays]) -> tuple[Arrays, list[int]] | None:
    """Concatenate items along axis 0 when every item has the same names and trailing shapes."""
    names = inputs[0].keys()
    if any(item.keys() != names for item in inputs):
        return None
    for name in names:
        shapes = {np.shape(item[name])[1:] for item in inputs}
        dims = {np.ndim(item[name]) for item in inputs}
        if len(shapes) != 1 or dims == {0}:
            return None
    sizes = [int(np.shape(next(iter(item.values())))[0]) for item in inputs]
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
