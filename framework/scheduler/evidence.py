"""Which of two runtimes runs a model faster, judged from the paces measured in service.

A runtime's pace is a task's run time expressed as one item's time on that runtime (measured
over modelled, times the cost model's one-item figure there, so two runtimes' paces compare
directly), kept as its logarithm for the last :data:`EVIDENCE_TASKS` tasks (where warm-up
measured the runtimes' core shares, tasks that ran alone: the condition a trial runs under).
Two runtimes are told apart by a rank test (Mann-Whitney's U, normal approximation with ties
corrected): it asks only whether one runtime's paces tend to lie below the other's, so one task
ten times slower (a hiccup of the machine) counts as one slow task, not as ten; and it says how
sure that is, so a few tasks whose sizes and neighbours differ by more than the runtimes do
cannot move a model. The trials in :mod:`~hetero.framework.scheduler.exploring` add their tasks
to the runner-up's paces, so evidence grows across trials until the test decides.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np

__all__ = ["EVIDENCE_TASKS", "SIGNIFICANT_Z", "Paces", "rank_z"]

# The paces kept per runtime and model: the recent ones, so a runtime's figure follows what
# the machine does now; 64 tasks tell apart runtimes 10 % apart when one task's pace varies by
# 15 % (what one request's size and the machine's noise gave on the two-core bench machine).
EVIDENCE_TASKS = 64
# |z| at which the test decides: one trial in about 44 would move a model between two equally
# fast runtimes (one-sided), and each such trial is followed by a longer period.
SIGNIFICANT_Z = 2.0


class Paces:
    """The logarithms of a runtime's recent paces for one model (module docstring), one per
    task. The tasks of one batch share its run time, so a batch of several tasks counts as
    several alike observations (alone, a batch holds the parts of one request at most)."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: deque[float] = deque(maxlen=EVIDENCE_TASKS)

    def add(self, log_pace: float) -> None:
        """Add one task's pace (a logarithm)."""
        self.values.append(log_pace)

    def median(self) -> float:
        """The median of the kept paces (a logarithm); NaN when none is kept."""
        return float(np.median(self.values)) if self.values else math.nan

    def __len__(self) -> int:
        return len(self.values)


def rank_z(candidate: Sequence[float], incumbent: Sequence[float]) -> float:
    """How far the candidate's values lie above the incumbent's, in standard deviations of
    Mann-Whitney's U under no difference: negative when the candidate's tend to be lower
    (faster, for paces), 0 when either is empty or every value is the same."""
    n1, n2 = len(candidate), len(incumbent)
    if n1 == 0 or n2 == 0:
        return 0.0
    values = np.concatenate([np.asarray(candidate, float), np.asarray(incumbent, float)])
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    mid_ranks = np.cumsum(counts) - (counts - 1) / 2.0  # tied values share their mean rank
    u = float(mid_ranks[inverse[:n1]].sum()) - n1 * (n1 + 1) / 2.0
    total = n1 + n2
    ties = float(np.sum(counts.astype(float) ** 3 - counts)) / (total * (total - 1))
    variance = n1 * n2 / 12.0 * ((total + 1) - ties)
    if variance <= 0.0:
        return 0.0
    return (u - n1 * n2 / 2.0) / math.sqrt(variance)
