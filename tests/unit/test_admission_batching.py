"""Complexity admission (admit / degrade / shed) and the batcher, on explicit numbers."""

from __future__ import annotations

from hetero.framework.policy.schema import ComplexityBreaker as ComplexityConfig
from hetero.framework.scheduler import Admission, Batcher, ComplexityBreaker, RequestProfile

CONFIG = ComplexityConfig(degrade_at=0.5)


def test_profile_is_a_weighted_sum_in_fixed_units() -> None:
    profile = RequestProfile(text_tokens=2000, image_pixels=3_000_000, audio_seconds=60)
    assert profile.score(CONFIG) == 2.0 + 3.0 + 2.0


def test_a_request_that_fits_its_deadline_is_admitted_whatever_came_before() -> None:
    breaker = ComplexityBreaker(CONFIG)
    for _ in range(600):  # a stream of tiny requests: nothing here remembers them
        assert breaker.decide(0.001, 0.0, 10.0).action is Admission.ADMIT
    normal = breaker.decide(0.05, 0.2, 10.0)  # 34x heavier than the stream: still fits
    assert normal.action is Admission.ADMIT and normal.expected_s == 0.25


def test_past_half_the_deadline_runs_light_and_past_the_deadline_is_shed() -> None:
    breaker = ComplexityBreaker(CONFIG)
    assert breaker.decide(4.0, 0.5, 10.0, light_run_s=1.0).action is Admission.ADMIT
    degraded = breaker.decide(4.0, 2.0, 10.0, light_run_s=1.0)
    assert degraded.action is Admission.DEGRADE and "0.5 of the deadline" in degraded.reason
    assert breaker.decide(4.0, 2.0, 10.0).action is Admission.ADMIT  # no light: still fits
    shed = breaker.decide(4.0, 9.0, 10.0, light_run_s=2.0)
    assert shed.action is Admission.SHED and "10 s deadline" in shed.reason
    # Retry-After: when the queue will have drained enough for the cheaper variant to fit
    assert shed.retry_after_s == 9.0 + 2.0 - 10.0


def test_an_idle_stage_admits_anything() -> None:
    breaker = ComplexityBreaker(CONFIG)
    assert breaker.decide(60.0, 0.0, 10.0, busy=False).action is Admission.ADMIT
    assert breaker.decide(60.0, 0.0, 10.0, busy=True).action is Admission.SHED


def test_retry_after_is_at_least_a_second() -> None:
    shed = ComplexityBreaker(CONFIG).decide(10.1, 0.05, 10.0)
    assert shed.action is Admission.SHED and shed.retry_after_s == 1.0


def test_batcher_releases_a_full_batch_or_after_the_delay() -> None:
    batcher: Batcher[str] = Batcher(max_batch=3, max_delay_s=0.005)
    batcher.add("a", 0.0)
    batcher.add("b", 0.001)
    assert not batcher.ready(0.002) and batcher.take(0.002) == []
    assert batcher.due_at() == 0.005
    assert batcher.take(0.005) == ["a", "b"]  # the delay ran out
    for name, at in (("c", 1.0), ("d", 1.0), ("e", 1.0), ("f", 1.0)):
        batcher.add(name, at)
    assert batcher.take(1.0) == ["c", "d", "e"]  # full before any delay
    assert len(batcher) == 1 and batcher.take(1.0) == []


def test_a_batcher_with_sizes_holds_max_batch_inputs_not_entries() -> None:
    # entries are (name, inputs): parts of a large request hold several inputs each
    batcher: Batcher[tuple[str, int]] = Batcher(max_batch=32, max_delay_s=0.0, size=lambda e: e[1])
    for entry in (("part1", 20), ("part2", 20), ("one", 1), ("huge", 40)):
        batcher.add(entry, 0.0)
    assert batcher.take(0.0) == [("part1", 20)]  # part2 would make 40 inputs
    assert batcher.take(0.0) == [("part2", 20), ("one", 1)]
    assert batcher.take(0.0) == [("huge", 40)]  # an entry over the bound runs alone
    assert len(batcher) == 0 and batcher.take(0.0) == []
    counted: Batcher[tuple[str, int]] = Batcher(max_batch=2, max_delay_s=1.0, size=lambda e: e[1])
    counted.add(("a", 2), 0.0)
    assert counted.ready(0.0)  # full by its inputs before its delay runs out
