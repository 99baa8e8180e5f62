"""Which of two runtimes runs a model faster, judged from the paces measured in service.

A runtime's pace is a task's run time expressed as one item's time on that runtime (measured
over modelled, times the cost model's one-item figure there, so two runtimes' paces compare
directly), kept as its logarithm. A machine's speed drifts by more than two runtimes differ
(on the two-core bench machine the same stack's point moved by 20 % within a minute), so a
runner-up's trial is compared with the preferred runtime as it ran just before the trial:
each trial task gives one difference, its pace less the median of the preferred runtime's
last :data:`BASELINE_TASKS` paces (tasks that ran alone, as a trial does), and the differences
of a pair of runtimes are kept across trials (the last :data:`EVIDENCE_TASKS`). Wilcoxon's
signed-rank test (normal approximation, ties corrected) says whether they lie below zero or
above it: it asks only for the sign and the order of the differences, so one task ten times
slower (a hiccup of the machine) counts as one slow task, not as ten; and it says how sure
that is, so a few tasks whose sizes differ by more than the runtimes do cannot move a model.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np

__all__ = [
    "BASELINE_TASKS",
    "EVIDENCE_TASKS",
    "SIGNIFICANT_Z",
    "Paces",
    "PairEvidence",
    "signed_rank_z",
]

# The preferred runtime's paces a trial is compared with: its last tasks before the trial, a
# third of a second at concurrency 1 on the bench machine, so the machine's drift falls on
# both sides of a difference alike.
BASELINE_TASKS = 16
# The differences kept per pair of runtimes and model: 64 tell apart runtimes 10 % apart when
# one task's pace varies by 15 % (one request's size and the machine's noise on the two-core
# bench machine).
EVIDENCE_TASKS = 64
# |z| at which the test decides: one trial in about 44 would move a model between two equally
# fast runtimes (one-sided), and each trial that does not is followed by a longer period.
SIGNIFICANT_Z = 2.0


class Paces:
    """The logarithms of a runtime's last :data:`BASELINE_TASKS` paces for one model."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: deque[float] = deque(maxlen=BASELINE_TASKS)

    def add(self, log_pace: float) -> None:
        """Add one task's pace (a logarithm)."""
        self.values.append(log_pace)

    def median(self) -> float:
        """The median of the kept paces (a logarithm); NaN when none is kept."""
        return float(np.median(self.values)) if self.values else math.nan

    def __len__(self) -> int:
        return len(self.values)


class PairEvidence:
    """The differences measured between two runtimes of one model, kept in one direction
    (the second runtime's pace less the first's): :meth:`toward` reads them from either side,
    so the evidence that made one runtime take a model stands when the other is tried."""

    __slots__ = ("first", "values")

    def __init__(self, first: int) -> None:
        self.first = first
        self.values: deque[float] = deque(maxlen=EVIDENCE_TASKS)

    def add(self, runner_up: int, difference: float) -> None:
        """Add ``runner_up``'s pace less the other runtime's (a difference of logarithms)."""
        self.values.append(difference if runner_up != self.first else -difference)

    def toward(self, runner_up: int) -> list[float]:
        """The differences as ``runner_up``'s pace less the other's."""
        return list(self.values) if runner_up != self.first else [-v for v in self.values]

    def __len__(self) -> int:
        return len(self.values)


def signed_rank_z(differences: Sequence[float]) -> float:
    """How far ``differences`` lie above zero, in standard deviations of Wilcoxon's
    signed-rank statistic under no difference: negative when they tend to be below zero (the
    runner-up faster, for paces), 0 when none is non-zero."""
    values = np.asarray([d for d in differences if d != 0.0], float)
    n = len(values)
    if n == 0:
        return 0.0
    _, inverse, counts = np.unique(np.abs(values), return_inverse=True, return_counts=True)
    mid_ranks = np.cumsum(counts) - (counts - 1) / 2.0  # tied sizes share their mean rank
    positive = float(mid_ranks[inverse][values > 0].sum())
    ties = float(np.sum(counts.astype(float) ** 3 - counts)) / 48.0
    variance = n * (n + 1) * (2 * n + 1) / 24.0 - ties
    if variance <= 0.0:
        return 0.0
    return (positive - n * (n + 1) / 4.0) / math.sqrt(variance)
