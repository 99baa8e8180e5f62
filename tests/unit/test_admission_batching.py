"""Complexity admission (admit / degrade / shed) and the batcher, on explicit numbers."""

from __future__ import annotations

from hetero.framework.policy.schema import ComplexityBreaker as ComplexityConfig
from hetero.framework.scheduler import Admission, Batcher, ComplexityBreaker, RequestProfile

CONFIG = ComplexityConfig(window=100, min_samples=10, degrade_above_p95=2.0, shed_above_p95=4.0)


def warmed() -> ComplexityBreaker:
    breaker = ComplexityBreaker(CONFIG)
    for tokens in range(100, 1100, 100):  # profiles 0.1 .. 1.0; p95 = 1.0
        assert (
            breaker.decide(RequestProfile(text_tokens=tokens), 0.0, 1.0).action is Admission.ADMIT
        )
    return breaker


def test_everything_is_admitted_until_the_window_has_enough_samples() -> None:
    breaker = ComplexityBreaker(CONFIG)
    huge = RequestProfile(text_tokens=10**6)
    assert breaker.decide(huge, 0.0, 1.0).action is Admission.ADMIT
    assert breaker.p95() is None


def test_profile_is_a_weighted_sum_in_fixed_units() -> None:
    profile = RequestProfile(text_tokens=2000, image_pixels=3_000_000, audio_seconds=60)
    assert profile.score(CONFIG) == 2.0 + 3.0 + 2.0


def test_heavy_requests_degrade_then_shed_with_retry_after() -> None:
    assert warmed().decide(RequestProfile(text_tokens=1500), 0.0, 1.0).action is Admission.ADMIT
    degraded = warmed().decide(RequestProfile(text_tokens=2500), 0.0, 1.0)
    assert degraded.action is Admission.DEGRADE and degraded.p95 == 1.0
    shed = warmed().decide(RequestProfile(text_tokens=4000), 3.0, 5.0)
    assert shed.action is Admission.SHED
    assert shed.retry_after_s == 3.0
    assert "x the recent p95" in shed.reason


def test_a_queue_past_the_deadline_lowers_the_thresholds() -> None:
    relaxed = warmed().decide(RequestProfile(text_tokens=2500), 0.0, 1.0)
    pressed = warmed().decide(RequestProfile(text_tokens=2500), 2.0, 1.0)
    assert (relaxed.action, pressed.action) == (Admission.DEGRADE, Admission.SHED)


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
