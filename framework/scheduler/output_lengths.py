"""What a generation of each stage is learnt to take, from the ones that finished: how many
tokens it produces (what placement by expected completion, :mod:`completion`, assumes for a
new sequence, since no server knows a sequence's output length before it has generated it),
and how long sequences took against the completion that placement predicted for them (the
roofline figures leave out the runtime's efficiency, which only running measures)."""

from __future__ import annotations

import numpy as np

__all__ = ["OutputLengths", "SequenceTimes"]

HORIZON = 64  # the mean of the first 64 finished sequences, then exponential over about 64
WINDOW = 256  # the recent generations whose lengths' distribution is kept
SHORT = 0.1  # the quantile :meth:`OutputLengths.short` gives
LONG = 0.9  # the quantile :meth:`OutputLengths.long` gives
PENDING = 4096  # sequences awaiting their end at most (the oldest forgotten)
MIN_TIMED = 16
"""Sequences timed before their measured-over-predicted ratio is trusted."""


class SequenceTimes:
    """Per stage, the ratio of the time its sequences took from placement to their last token
    to the completion placement predicted for them there (:meth:`placed`, :meth:`finished`):
    a running mean of each, their quotient."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[str, float, float]] = {}  # task id: stage, s, at
        self._predicted: dict[str, float] = {}
        self._measured: dict[str, float] = {}
        self._seen: dict[str, int] = {}

    def placed(self, task_id: int, stage: str, predicted_s: float, now: float) -> None:
        """Sequence ``task_id`` was placed at ``now``, predicted to finish ``predicted_s``
        later. Bounded: a caller that never reports the end forgets the oldest."""
        if len(self._pending) >= PENDING:
            del self._pending[next(iter(self._pending))]
        self._pending[task_id] = (stage, predicted_s, now)

    def finished(self, task_id: int, now: float) -> None:
        """Sequence ``task_id`` generated its last token at ``now`` (ignored when its placement
        predicted nothing)."""
        placed = self._pending.pop(task_id, None)
        if placed is None:
            return
        stage, predicted, at = placed
        seen = self._seen.get(stage, 0) + 1
        self._seen[stage] = seen
        weight = 1.0 / min(seen, HORIZON)
        mean = self._predicted.get(stage, 0.0)
        self._predicted[stage] = mean + weight * (predicted - mean)
        mean = self._measured.get(stage, 0.0)
        self._measured[stage] = mean + weight * (now - at - mean)

    def dropped(self, task_id: int) -> None:
        """Sequence ``task_id`` will not finish (cancelled, failed): forget it."""
        self._pending.pop(task_id, None)

    def ratio(self, stage: str) -> float | None:
        """Measured over predicted for ``stage``'s sequences (None until :data:`MIN_TIMED`
        finished)."""
        if self._seen.get(stage, 0) < MIN_TIMED:
            return None
        predicted = self._predicted[stage]
        return self._measured[stage] / predicted if predicted > 0 else None


class OutputLengths:
    """A running mean of finished sequences' output tokens per stage, the recent ones'
    tenth and 90th percentiles (:meth:`short`, :meth:`long`), and their times
    (:attr:`times`)."""

    def __init__(self) -> None:
        self._mean: dict[str, float] = {}
        self._seen: dict[str, int] = {}
        self._recent: dict[str, np.ndarray] = {}
        self._short: dict[str, int] = {}
        self._long: dict[str, int] = {}
        self.times = SequenceTimes()

    def observe(self, stage: str, tokens: int) -> None:
        """A sequence of ``stage`` finished after ``tokens`` output tokens."""
        seen = self._seen.get(stage, 0) + 1
        self._seen[stage] = seen
        weight = 1.0 / min(seen, HORIZON)
        mean = self._mean.get(stage, 0.0)
        self._mean[stage] = mean + weight * (tokens - mean)
        recent = self._recent.get(stage)
        if recent is None:
            recent = self._recent[stage] = np.zeros(WINDOW)
        recent[(seen - 1) % WINDOW] = tokens
        if seen <= HORIZON or seen % (WINDOW // 16) == 0:  # a sort of 256 now and then
            window = recent[: min(seen, WINDOW)]
            self._short[stage] = max(1, int(np.quantile(window, SHORT, method="lower")))
            self._long[stage] = max(1, int(np.quantile(window, LONG, method="higher")))

    def short(self, stage: str) -> int:
        """A length that nine in ten of the stage's recent generations reach (their tenth
        percentile; 0: none finished yet): a sequence predicted to miss its deadline even
        at this length misses it whatever it generates, bar a few."""
        return self._short.get(stage, 0)

    def expected(self, stage: str) -> int:
        """The tokens a new sequence of ``stage`` is expected to produce (0: none finished
        yet, so placement falls back to what does not need the length)."""
        mean = self._mean.get(stage)
        return 0 if mean is None else max(1, round(mean))

    def long(self, stage: str) -> int:
        """A length that only one in ten of the stage's recent generations exceeds (their
        90th percentile; 0: none finished yet): placement keeps a sequence off a device that
        would finish one this long later, even alone, than another candidate as it is
        (:meth:`ResidencyMixin._fast_enough_if_long`), so that one which turns out long is
        not where only a short one finishes soon."""
        return self._long.get(stage, 0)
