"""Predictive warm-up: the Holt-Winters forecaster sees a daily rise coming, and the warm-up
loads a model before its traffic, evicting only models forecast colder."""

from __future__ import annotations

from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import Scheduler, VirtualClock
from hetero.framework.scheduler.forecast import ArrivalForecaster
from hetero.framework.scheduler.warmup import PredictiveWarmup
from hetero.framework.topology import Topology

DAY = 600.0  # a compressed day of ten 60 s bins


def busy_half(day_start: float) -> list[float]:
    """One arrival a second during the second half of the day, none in the first."""
    return [day_start + DAY / 2 + i for i in range(int(DAY / 2))]


def test_seasonal_terms_forecast_the_rise_before_it_comes_and_holt_alone_does_not() -> None:
    seasonal = ArrivalForecaster(bin_s=60, alpha=0.1, beta=0.0, gamma=0.5, season_s=DAY)
    plain = ArrivalForecaster(bin_s=60, alpha=0.5, beta=0.3)
    for day in range(3):
        for when in busy_half(day * DAY):
            seasonal.observe("m", when)
            plain.observe("m", when)
    quiet = 3 * DAY + 60  # an hour into the fourth day's quiet half
    seasonal.advance(quiet)
    plain.advance(quiet)
    # The last closed bin is the fourth day's first; its busy half begins five bins ahead.
    assert seasonal.rate("m", 60) < 0.2  # still quiet next bin
    assert seasonal.rate("m", 300) > 0.8  # the busy half is coming
    assert plain.rate("m", 300) < 0.4  # no seasonality: the fall it saw goes on


def test_one_season_initialises_the_whole_profile_and_peak_rate_looks_over_the_horizon() -> None:
    """The classical initialisation: after the first season the level is its mean rate and
    the seasonal terms its profile, so the first rise of day two is forecast in full (seasonal
    terms learnt from zero at gamma 0.5 would forecast about 0.75 of it)."""
    forecaster = ArrivalForecaster(bin_s=60, alpha=0.1, beta=0.0, gamma=0.5, season_s=DAY)
    for when in busy_half(0.0):
        forecaster.observe("m", when)
    assert forecaster.rate("m", 60) == 4 / 9  # nine bins closed, four busy: the mean so far
    forecaster.advance(DAY + 60)  # day two's first (quiet) bin closed
    assert forecaster.rate("m", 60) == 0.0
    assert forecaster.rate("m", 300) > 0.95  # four bins on, the busy half begins
    assert forecaster.peak_rate("m", 240) < 0.05  # quiet for the next four bins...
    assert forecaster.peak_rate("m", 300) > 0.95  # ...and busy within five


POLICY = """\
version: 1
devices:
  simulated: [{name: a, preset: A100-SXM4-80GB, count: 1}]
stages:
  hot: &m {modality: text, variants: {full: {flops_per_item: 1 GFLOPS, bytes_per_item: 1 MB,
           resident_bytes: 50 GB}}}
  cold: *m
  rising: *m
routes: {/hot: hot, /cold: cold, /rising: rising}
scheduler:
  memory_reserve_fraction: 0.0
  min_residency_s: 100000
  warmup: {enabled: true, bin_s: 10, alpha: 0.5, beta: 0.5, season_s: 0, lead_s: 10,
           load_rate_per_s: 0.2}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 1000}}
"""


def test_warmup_loads_the_rising_model_evicting_only_a_colder_young_one() -> None:
    policy = load_policy_text(POLICY, "warmup.yaml")
    devices = simulated_devices(policy.spec.devices.simulated)
    clock = VirtualClock()
    scheduler = Scheduler(policy, devices, Topology(devices), clock)
    warmup = PredictiveWarmup(scheduler, policy.spec.scheduler.warmup)
    assert scheduler.preload(devices[0].id, "cold/full")  # young: min residency would keep it
    for second in range(30):
        warmup.observe(["rising/full"], second * (1.0 if second < 20 else 0.5))
    clock.advance(30.0)
    loads, released = warmup.tick(30.0)
    assert [(load.plan.key, load.plan.evict) for load in loads] == [("rising/full", ("cold/full",))]
    assert released == []
    assert scheduler.tables["rising/full"].resident.all()
    assert scheduler.stats.counts["prefetches"] == 1
    # A model forecast at about the same rate does not push it out again (hysteresis).
    assert scheduler.prefetch("hot/full", frozenset()) is None
