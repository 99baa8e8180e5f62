"""Per-model arrival-rate forecasts: Holt-Winters additive exponential smoothing over fixed
bins.

Arrivals are counted in bins of ``bin_s`` seconds. When bin ``t`` closes with ``y`` arrivals
(rate ``r = y / bin_s``), each model's level ``l``, trend ``b`` and seasonal terms ``s`` (one
per bin of a season of ``m = season_s / bin_s`` bins; none when ``season_s`` is 0, which is
Holt's linear method) move as

```
l' = alpha * (r - s[t - m]) + (1 - alpha) * (l + b)
b' = beta * (l' - l) + (1 - beta) * b
s[t] = gamma * (r - l') + (1 - gamma) * s[t - m]
```

and the rate forecast ``h`` bins ahead is ``max(0, l' + h * b' + s[t - m + h])`` (Holt-Winters
additive method: Hyndman and Athanasopoulos, *Forecasting: Principles and Practice*, 3rd ed.,
section 8.3). With a season, the first season only records the rates: when it closes, each
model's level is its mean rate over the season, its seasonal terms the rate of each bin minus
that mean and its trend zero (the classical initialisation, Holt-Winters' own: Winters 1960,
and Hyndman et al. 2008, section 2.6.1), so the second season starts from the whole profile the
first one showed rather than from seasonal terms learnt at a rate of ``gamma`` per season.
Until then a model's forecast is its mean rate so far. A model first seen after the first
season starts with its first bin as level and zero seasonal terms. It needs no fitting and no
dependency and costs O(models) per bin. The seasonal terms are what lets a warm-up load a
model *before* its traffic returns (a level at zero forecasts nothing); the trend follows a
ramp already under way. :meth:`ArrivalForecaster.peak_rate` is the highest forecast over a
horizon: what the warm-up judges a model by (busy at any time soon, or quiet throughout).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ArrivalForecaster"]


@dataclass(slots=True)
class _State:
    level: float
    trend: float = 0.0
    season: list[float] = field(default_factory=list)


@dataclass(slots=True)
class ArrivalForecaster:
    """Forecasts of arrivals per second per model key."""

    bin_s: float
    alpha: float
    beta: float
    gamma: float = 0.0
    season_s: float = 0.0
    _states: dict[str, _State] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)
    _bin_start: float = 0.0
    _bins_closed: int = 0
    _first_season: dict[str, list[float]] = field(default_factory=dict)

    @property
    def season_bins(self) -> int:
        """Bins per season (0: no seasonality)."""
        return round(self.season_s / self.bin_s) if self.season_s > 0 else 0

    def observe(self, key: str, now: float) -> None:
        """One arrival for ``key`` at ``now``."""
        self.advance(now)
        self._counts[key] = self._counts.get(key, 0) + 1

    def advance(self, now: float) -> None:
        """Close every bin that ended by ``now`` (empty ones too: a quiet model's level
        falls)."""
        period = self.season_bins
        while now >= self._bin_start + self.bin_s:
            if period and self._bins_closed < period:
                self._record_first_season(period)
            else:
                self._update(period)
            self._counts.clear()
            self._bin_start += self.bin_s
            self._bins_closed += 1

    def _record_first_season(self, period: int) -> None:
        """A bin of the first season closed: keep its rates; at its end, initialise."""
        closed = self._bins_closed
        for key in sorted(set(self._first_season) | set(self._counts)):
            rates = self._first_season.setdefault(key, [0.0] * closed)
            rates.append(self._counts.get(key, 0) / self.bin_s)
        if closed + 1 < period:
            return
        for key, rates in self._first_season.items():
            level = sum(rates) / period
            self._states[key] = _State(level=level, season=[r - level for r in rates])
        self._first_season.clear()

    def _update(self, period: int) -> None:
        """A bin closed after the first season: the Holt-Winters recurrences."""
        slot = self._bins_closed % period if period else 0
        for key in sorted(set(self._states) | set(self._counts)):
            rate = self._counts.get(key, 0) / self.bin_s
            state = self._states.get(key)
            if state is None:
                self._states[key] = _State(level=rate, season=[0.0] * period)
                continue
            seasonal = state.season[slot] if period else 0.0
            level = self.alpha * (rate - seasonal) + (1 - self.alpha) * (state.level + state.trend)
            state.trend = self.beta * (level - state.level) + (1 - self.beta) * state.trend
            if period:
                state.season[slot] = self.gamma * (rate - level) + (1 - self.gamma) * seasonal
            state.level = level

    def rate(self, key: str, horizon_s: float) -> float:
        """Forecast arrivals per second of ``key``, ``horizon_s`` after the last closed bin."""
        return self._rate(key, max(1, round(horizon_s / self.bin_s)))

    def peak_rate(self, key: str, horizon_s: float) -> float:
        """The highest forecast of ``key`` over the bins from the next one to ``horizon_s``
        ahead."""
        steps = max(1, round(horizon_s / self.bin_s))
        return max(self._rate(key, step) for step in range(1, steps + 1))

    def _rate(self, key: str, steps: int) -> float:
        state = self._states.get(key)
        if state is None:
            rates = self._first_season.get(key)
            return sum(rates) / len(rates) if rates else 0.0
        period = self.season_bins
        seasonal = state.season[(self._bins_closed - 1 + steps) % period] if period else 0.0
        return max(0.0, state.level + state.trend * steps + seasonal)
