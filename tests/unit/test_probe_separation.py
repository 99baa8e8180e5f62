"""Warm-up times the two fastest runtimes again while its first rounds cannot tell them apart,
for at most as long again as those rounds took (WarmUp._separate)."""

from __future__ import annotations

import itertools
from typing import Any

from hetero.framework.engine.probing import EXTRA_PROBE_RUNS
from hetero.framework.engine.warmup import WarmUp


def _warmup(times: dict[str, Any]) -> tuple[WarmUp, list[str]]:
    """A WarmUp whose timed runs come from ``times`` (an iterator of seconds per device)."""
    warm = WarmUp.__new__(WarmUp)
    calls: list[str] = []

    def run_once(stage: str, device_id: str, probe: Any) -> float:
        calls.append(device_id)
        return float(next(times[device_id]))

    warm._run_once = run_once  # type: ignore[method-assign]
    return warm, calls


def _separate(samples: dict[str, list[float]], times: dict[str, Any]) -> list[str]:
    warm, calls = _warmup(times)
    warm._separate("s", None, samples, {}, {}, lambda stage, message: None)
    return calls


def test_runtimes_the_first_rounds_cannot_tell_apart_are_timed_again_and_ranked_by_speed() -> None:
    # b is faster (9 ms against 10) but a burst hit its first runs: a looks faster by its best
    samples = {"a": [0.0100, 0.0101, 0.0104], "b": [0.0102, 0.0120, 0.0130], "c": [0.03] * 3}
    times = {"a": itertools.repeat(0.0100), "b": itertools.repeat(0.0090)}
    calls = _separate(samples, times)
    assert calls and set(calls) == {"a", "b"}  # the slowest one is not timed again
    assert calls[:2] == ["a", "b"] and len(calls) % 2 == 0  # in turn, each round both
    assert min(samples["b"]) < min(samples["a"])  # the ranking is now the runtimes'


def test_more_runs_are_bounded_by_the_time_the_first_rounds_took() -> None:
    samples = {"a": [0.010, 0.011, 0.012], "b": [0.0105, 0.011, 0.012]}
    budget = sum(map(sum, samples.values()))  # 66.5 ms; a round of both takes 20.5 ms
    times = {"a": itertools.repeat(0.010), "b": itertools.repeat(0.0105)}
    calls = _separate(samples, times)
    assert calls == ["a", "b"] * 4  # the round that passes the budget is the last
    assert 0.0205 * 3 < budget <= 0.0205 * 4
    assert EXTRA_PROBE_RUNS > 4  # the time, not the count, bounded it


def test_runtimes_the_first_rounds_tell_apart_are_not_timed_again() -> None:
    # the control: the runner-up's best is slower than the fastest one's worst
    samples = {"a": [0.010, 0.0102, 0.0101], "b": [0.013, 0.014, 0.0135]}
    times = {"a": itertools.repeat(0.010), "b": itertools.repeat(0.013)}
    assert _separate(samples, times) == []
    assert _separate({"a": [0.01]}, {}) == []  # one runtime: nothing to tell apart
