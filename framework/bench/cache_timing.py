"""``hetero bench cache``'s timing: each action's cost as the median of rounds' medians, the
actions timed in alternation (each pass in an order drawn afresh) so a ratio of two is fair."""

from __future__ import annotations

import itertools
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

READS = 5000
REPEATS = 5  # each per-operation figure is the median of this many rounds' medians


def _figures(rounds: list[list[int]]) -> dict[str, Any]:
    """p50 (the median of the rounds' medians, with each round's), mean and p99 over all."""
    medians = [statistics.median(series) for series in rounds]
    every = sorted(itertools.chain.from_iterable(rounds))
    return {
        "p50_us": statistics.median(medians) / 1000,
        "p50_us_by_round": [round(m / 1000, 3) for m in medians],
        "mean_us": statistics.fmean(every) / 1000,
        "p99_us": every[int(0.99 * len(every))] / 1000,
    }


def _timed(action: Callable[[], Any], reads: int = READS) -> dict[str, Any]:
    """One action's cost: ``REPEATS`` rounds of ``reads / REPEATS`` calls after a warm-up."""
    return _timed_together(action, reads=reads)[0]


def _timed_together(*actions: Callable[[], Any], reads: int = READS) -> list[dict[str, Any]]:
    """The actions timed in alternation, so the machine's noise (other processes, a busy
    core) hits all alike: a ratio of two is then a fair one. Each pass runs every action once,
    in an order drawn afresh (seeded, so runs are alike): in a fixed cycle each action always
    follows the same one and inherits what that one left in the CPU's caches (the L3 hit after
    the raw diskcache read measured 1.58-1.60x the raw LMDB read plus decode, 1.41-1.43x with
    the order drawn, the same code: docs/runs/cache.md). ``REPEATS`` rounds; each figure's p50 is
    the median of the rounds' medians."""
    for _ in range(200):
        for action in actions:
            action()
    rounds: list[list[list[int]]] = [[] for _ in actions]
    clock = time.perf_counter_ns
    draw = random.Random(0).shuffle
    order = list(zip(actions, range(len(actions)), strict=True))
    for _ in range(REPEATS):
        samples: list[list[int]] = [[] for _ in actions]
        for _ in range(reads // REPEATS):
            draw(order)
            for action, index in order:
                started = clock()
                action()
                samples[index].append(clock() - started)
        for per_action, series in zip(rounds, samples, strict=True):
            per_action.append(series)
    return [_figures(per_action) for per_action in rounds]
