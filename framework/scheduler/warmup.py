"""Predictive warm-up (the design's hot and cold model pools): load a model before its
traffic arrives, release it after.

Every arrival is counted for the models of its pipeline; at each bin boundary the forecaster
(:mod:`forecast`) predicts every model's arrival rate over the next ``lead_s`` and takes its
peak: a model is as hot as it is forecast to be at any time soon. Models forecast at or
above ``load_rate_per_s`` that are resident nowhere are loaded, hottest first, on the device
where they load fastest, evicting only idle models forecast colder than them (minimum residency
does not protect a model from a hotter one's forecast). Idle models forecast below
``release_rate_per_s`` are released. The reactive memory manager still does everything else:
a forecast that misses costs one load, as a reactive miss would.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero.framework.policy.schema import WarmupConfig
from hetero.framework.scheduler.forecast import ArrivalForecaster
from hetero.framework.scheduler.memory import LoadPlan
from hetero.framework.scheduler.scheduler import Scheduler

__all__ = ["PredictiveWarmup", "WarmupLoad"]


@dataclass(frozen=True, slots=True)
class WarmupLoad:
    """A load the warm-up placed: carry out ``plan`` on ``device_id``."""

    device_id: str
    plan: LoadPlan


class PredictiveWarmup:
    """Forecast-driven loads and releases for one scheduler."""

    def __init__(self, scheduler: Scheduler, config: WarmupConfig) -> None:
        self.scheduler = scheduler
        self.config = config
        self.forecaster = ArrivalForecaster(
            config.bin_s, config.alpha, config.beta, config.gamma, config.season_s
        )
        self.next_tick = config.bin_s

    def observe(self, model_keys: list[str], now: float) -> None:
        """A request arrived that will run these models."""
        for key in model_keys:
            self.forecaster.observe(key, now)

    def tick(self, now: float) -> tuple[list[WarmupLoad], list[tuple[str, str]]]:
        """At a bin boundary: the loads to carry out and the ``(device, model)`` released."""
        self.forecaster.advance(now)
        self.next_tick = now + self.config.bin_s
        config = self.config
        peak = self.forecaster.peak_rate
        forecast = {key: peak(key, config.lead_s) for key in self.scheduler.tables}
        loads = []
        for key in sorted(forecast, key=lambda k: (-forecast[k], k)):
            if forecast[key] < config.load_rate_per_s:
                break
            # Hysteresis: only a model forecast at under half the rate makes way, so two models
            # of about the same forecast do not take turns.
            colder = frozenset(k for k, rate in forecast.items() if 2 * rate < forecast[key])
            placed = self.scheduler.prefetch(key, colder)
            if placed is not None:
                loads.append(WarmupLoad(*placed))
        released = []
        for manager in self.scheduler.memory:
            for key in sorted(manager.resident):
                if forecast.get(key, 0.0) < config.release_rate_per_s and self.scheduler.release(
                    manager.device_id, key
                ):
                    released.append((manager.device_id, key))
        return loads, released
