"""The test that tells two runtimes' paces apart (``framework/scheduler/evidence.py``)."""

from __future__ import annotations

import numpy as np

from hetero.framework.scheduler.evidence import (
    BASELINE_TASKS,
    SIGNIFICANT_Z,
    Paces,
    PairEvidence,
    signed_rank_z,
)


def test_differences_below_zero_give_a_negative_z_and_above_it_a_positive_one() -> None:
    differences = np.random.default_rng(3).normal(-0.1, 0.15, 32)
    assert signed_rank_z(differences) <= -SIGNIFICANT_Z
    assert signed_rank_z(-differences) >= SIGNIFICANT_Z


def test_differences_around_zero_are_not_told_apart() -> None:
    assert abs(signed_rank_z(np.random.default_rng(4).normal(0.0, 0.15, 32))) < SIGNIFICANT_Z
    assert signed_rank_z([0.0, 0.0, 0.0]) == 0.0 == signed_rank_z([])
    assert signed_rank_z([0.1, -0.1]) == 0.0  # one each way, alike in size


def test_one_task_ten_times_slower_counts_as_one_slow_task() -> None:
    """Six tasks 0.72x the preferred runtime's pace and one 10x: by the mean of their
    logarithms the runner-up is slower (1.05x); by signs and ranks it leans faster, and four
    more tasks like the six tell it apart."""
    fast, hiccup = float(np.log(0.72)), float(np.log(10.0))
    differences = [hiccup, *[fast] * 6]
    assert float(np.mean(differences)) > 0.0
    assert -SIGNIFICANT_Z < signed_rank_z(differences) < 0.0
    assert signed_rank_z([*differences, *[fast] * 4]) <= -SIGNIFICANT_Z


def test_a_pairs_evidence_reads_the_same_from_either_runtime() -> None:
    """What made runtime 3 take a model from runtime 1 counts against 1 when 1 is tried."""
    evidence = PairEvidence(first=1)
    for difference in (-0.2, -0.1, -0.3):
        evidence.add(3, difference)  # runtime 3's pace less runtime 1's
    assert evidence.toward(3) == [-0.2, -0.1, -0.3]
    assert evidence.toward(1) == [0.2, 0.1, 0.3]
    evidence.add(1, 0.05)  # runtime 1, tried: 5 % slower than 3 just before
    assert evidence.toward(3)[-1] == -0.05
    assert signed_rank_z(evidence.toward(1)) > 0 > signed_rank_z(evidence.toward(3))


def test_paces_keep_the_last_tasks_only() -> None:
    paces = Paces()
    for value in range(BASELINE_TASKS + 10):
        paces.add(float(value))
    assert len(paces) == BASELINE_TASKS
    assert paces.median() == float(np.median(np.arange(10, BASELINE_TASKS + 10)))
    assert np.isnan(Paces().median())
