"""Where an LLM sequence finishes soonest: the expected completion of a sequence of a
continuously batched KV-cache model on each candidate device, and what placing it there
costs the sequences already running there (issue 36, docs/scheduler.md)."""

from __future__ import annotations

import numpy as np

from hetero.framework.scheduler.output_lengths import OutputLengths
from hetero.framework.scheduler.state import SchedulerState
from hetero.framework.scheduler.tables import StageTables
from hetero.framework.scheduler.tasks import StageTask

__all__ = ["CompletionMixin"]


class CompletionMixin(SchedulerState):
    """The marginal completion cost of a sequence on each device, from the roofline figures
    of the model's hint and the device, the model's sequences already placed there and the KV
    cache reserved there."""

    output_lengths: OutputLengths
    _predicted: tuple[int, np.ndarray, np.ndarray] | None = None
    """The last sequence placed by added completion: its id, the candidates, and its own
    predicted completion on each (:meth:`_timed`)."""

    def _kv_device_figures_of(self, tables: StageTables) -> tuple[np.ndarray, np.ndarray]:
        """Per device: one nominal request's compute at the device's peak (its prefill, the
        pace of :meth:`ResidencyMixin._kv_pace_s`), and one over the memory bandwidth. Kept
        per model, made again when its hint or the fleet changes."""
        hint = tables.costs.hint
        kept = self._kv_device_figures.get(tables.costs.key)
        if kept is not None and kept[0] is hint and kept[1].size == len(self.devices):
            return kept[1], kept[2]
        peaks = np.array([d.peak_flops_for(hint.dtype) for d in self.devices], dtype=float)
        bandwidth = np.array([d.memory_bandwidth_bytes_per_s for d in self.devices], float)
        pace = np.zeros(peaks.size)
        np.divide(hint.flops_per_item, peaks, out=pace, where=peaks > 0)
        inverse = np.zeros(bandwidth.size)
        np.divide(1.0, bandwidth, out=inverse, where=bandwidth > 0)
        self._kv_device_figures[tables.costs.key] = (hint, pace, inverse)
        return pace, inverse

    def sequence_cost_s(
        self, task: StageTask, tables: StageTables, mask: np.ndarray, kv_bytes: int
    ) -> np.ndarray:
        """Per device of ``mask`` (infinity elsewhere), the seconds of completion time that
        placing LLM sequence ``task`` there now adds up over the sequences of the device:
        its own expected completion plus what it costs those already running.

        Its own: the model's load where it is not resident, its input's transfer, one
        prefill (a nominal request's compute at the device's peak), its ``output_tokens``
        decode steps, each reading the weights plus the KV cache reserved on the device and
        its own at the device's memory bandwidth (decode is memory-bound), and a prefill
        stall for each of the ``m`` sequences of the model already there (each leaves before
        it does, and the sequence that takes its place stalls every running decode for a
        prefill). What it costs the others: its own prefill stalls each of the ``m``, and its
        KV cache slows each of their steps for about half its output. Roofline figures
        throughout: the measured correction of an LLM sequence mixes in the batch it ran in,
        so it does not rank devices here. ``kv_bytes``: the task's KV reservation."""
        indices, own, others = self._sequence_terms(task, tables, mask, kv_bytes)
        cost = np.full(len(self.devices), np.inf)
        cost[indices] = own + others
        return cost

    def _sequence_terms(
        self,
        task: StageTask,
        tables: StageTables,
        mask: np.ndarray,
        kv_bytes: int,
        tokens: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The devices of ``mask``, and on each the sequence's own expected completion and
        what it costs the sequences already there (:meth:`sequence_cost_s`), for ``tokens``
        output tokens (the task's ``output_tokens`` by default)."""
        tokens = task.output_tokens if tokens is None else tokens
        pace, inverse = self._kv_device_figures_of(tables)
        indices = np.flatnonzero(mask)
        running = tables.pending[indices]
        reserved = np.array([self.memory[i].kv_reserved for i in indices.tolist()], float)
        held = tables.resident_bytes[indices] + reserved + kv_bytes
        own = (
            tables.load_now[indices]
            + pace[indices] * (1.0 + running)
            + tokens * held * inverse[indices]
        )
        others = running * (pace[indices] + 0.5 * tokens * kv_bytes * inverse[indices])
        return indices, own, others

    def _alone_s(
        self, tables: StageTables, indices: np.ndarray, kv_bytes: int, tokens: int
    ) -> np.ndarray:
        """Per device of ``indices``, a sequence's own completion there (as
        :meth:`_sequence_terms` counts it) with the device to itself: no other sequence there,
        none of their KV cache, ``tokens`` output tokens, a KV cache of ``kv_bytes``."""
        pace, inverse = self._kv_device_figures_of(tables)
        held = tables.resident_bytes[indices] + kv_bytes
        alone: np.ndarray = (
            tables.load_now[indices] + pace[indices] + tokens * held * inverse[indices]
        )
        return alone

    def _timed(self, task: StageTask, index: int, now: float) -> None:
        """Note the completion predicted for sequence ``task`` on device ``index``, where it
        was placed at ``now`` (:class:`SequenceTimes` learns how long such predictions run)."""
        predicted = self._predicted
        if predicted is not None and predicted[0] == task.id:
            at = np.flatnonzero(predicted[1] == index)
            if at.size:
                seconds = float(predicted[2][int(at[0])])
                self.output_lengths.times.placed(task.id, task.stage, seconds, now)
        self._predicted = None

    def _step_wait_s(self, mask: np.ndarray) -> np.ndarray:
        """Per device of ``mask`` (0 elsewhere), how long a task placed there waits for the
        decode step in progress to end, on average: half a step of every KV-cache model with
        sequences there, a step reading its weights and the KV cache reserved there at the
        device's memory bandwidth (roofline)."""
        wait = np.zeros(len(self.devices))
        indices = np.flatnonzero(mask)
        if not indices.size:
            return wait
        reserved = np.array([self.memory[i].kv_reserved for i in indices.tolist()], float)
        for key in self._kv_keys:
            tables = self.tables[key]
            running = tables.pending[indices] > 0
            inverse = self._kv_device_figures_of(tables)[1][indices]
            wait[indices] += running * 0.5 * tables.resident_bytes[indices] * inverse
            wait[indices] += running * 0.5 * reserved * inverse  # the KV cache counted once
            reserved = np.where(running, 0.0, reserved)
        return wait
