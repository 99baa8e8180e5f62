"""How many tokens a generation of each stage is expected to produce, learnt from the ones
that finished: what placement by expected completion (:mod:`completion`) assumes for a new
sequence, since no server knows a sequence's output length before it has generated it."""

from __future__ import annotations

__all__ = ["OutputLengths"]

HORIZON = 64  # the mean of the first 64 finished sequences, then exponential over about 64


class OutputLengths:
    """A running mean of finished sequences' output tokens per stage."""

    def __init__(self) -> None:
        self._mean: dict[str, float] = {}
        self._seen: dict[str, int] = {}

    def observe(self, stage: str, tokens: int) -> None:
        """A sequence of ``stage`` finished after ``tokens`` output tokens."""
        seen = self._seen.get(stage, 0) + 1
        self._seen[stage] = seen
        weight = 1.0 / min(seen, HORIZON)
        mean = self._mean.get(stage, 0.0)
        self._mean[stage] = mean + weight * (tokens - mean)

    def expected(self, stage: str) -> int:
        """The tokens a new sequence of ``stage`` is expected to produce (0: none finished
        yet, so placement falls back to what does not need the length)."""
        mean = self._mean.get(stage)
        return 0 if mean is None else max(1, round(mean))
