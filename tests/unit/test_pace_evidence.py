"""The rank test that tells two runtimes' paces apart (``framework/scheduler/evidence.py``)."""

from __future__ import annotations

import numpy as np

from hetero.framework.scheduler.evidence import EVIDENCE_TASKS, SIGNIFICANT_Z, Paces, rank_z


def test_lower_paces_give_a_negative_z_and_higher_ones_a_positive_one() -> None:
    rng = np.random.default_rng(3)
    incumbent = rng.normal(0.0, 0.15, 64)
    faster = rng.normal(-0.15, 0.15, 32)
    assert rank_z(faster, incumbent) <= -SIGNIFICANT_Z
    assert rank_z(incumbent, faster) >= SIGNIFICANT_Z


def test_alike_paces_are_not_told_apart() -> None:
    rng = np.random.default_rng(4)
    assert abs(rank_z(rng.normal(0.0, 0.15, 16), rng.normal(0.0, 0.15, 64))) < SIGNIFICANT_Z
    assert rank_z([0.5] * 4, [0.5] * 64) == 0.0  # every value alike: no evidence either way
    assert rank_z([], [0.5]) == 0.0 == rank_z([0.5], [])


def test_one_task_ten_times_slower_counts_as_one_slow_task() -> None:
    """Three of four tasks faster than all the incumbent's, one 10x slower: by ranks the
    candidate leans faster (a mean of the logarithms would put it at 1.21x the incumbent),
    though four tasks do not decide it; four more like the three do."""
    candidate = [np.log(10.0), np.log(0.6), np.log(0.6), np.log(0.6)]
    incumbent = np.random.default_rng(5).normal(0.0, 0.05, 64)
    assert float(np.mean(candidate)) > 0.0
    assert -SIGNIFICANT_Z < rank_z(candidate, incumbent) < 0.0
    assert rank_z([*candidate, *[np.log(0.6)] * 4], incumbent) <= -SIGNIFICANT_Z


def test_paces_keep_the_recent_tasks_only() -> None:
    paces = Paces()
    for value in range(EVIDENCE_TASKS + 10):
        paces.add(float(value))
    assert len(paces) == EVIDENCE_TASKS
    assert paces.values[0] == 10.0
    assert paces.median() == float(np.median(np.arange(10, EVIDENCE_TASKS + 10)))
