"""Write ``trace.csv``: five models whose traffic rises and falls on a compressed day, each
at its own hour, with the minute-by-minute burstiness of the Azure LLM conversation trace.

``python benchmarks/scenarios/warmup/make_trace.py [AZURE_CONV_CSV]`` (default: the copy in
``../shared/data/traces/azure_llm_2023/``). Model ``m``'s rate at time ``t`` is

    peak x (FLOOR + (1 - FLOOR) x max(0, sin(2 pi (t / DAY_S - m / MODELS)))^4) x burst(t)

where ``burst`` is the Azure trace's arrivals per minute over their mean, its hour stretched
to ``DAY_S``: a day of tenants in five time zones, each busy for a few hours of it, with the
real trace's bursts on top. Arrivals are a non-homogeneous Poisson process drawn by thinning
with a fixed seed, so the file is the same on every run.
"""

from __future__ import annotations

import csv
import sys
from datetime import datetime
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
AZURE = HERE.parents[3] / "shared" / "data" / "traces" / "azure_llm_2023"
MODELS = 5
DAY_S = 3600.0
DURATION_S = 3 * DAY_S
PEAK_PER_S = 0.6
SEED = 17
FLOOR = 0.0  # share of its peak a model keeps off its hours


def burst_profile(path: Path) -> np.ndarray:
    """Arrivals per minute of the Azure trace over their mean."""
    with path.open(newline="", encoding="utf-8") as file:
        stamps = [datetime.fromisoformat(row["TIMESTAMP"][:26]) for row in csv.DictReader(file)]
    start = min(stamps)
    minutes = np.array([int((s - start).total_seconds() // 60) for s in stamps])
    counts = np.bincount(minutes).astype(float)
    return counts / counts.mean()


def rate(model: int, t: np.ndarray, burst: np.ndarray) -> np.ndarray:
    """Model ``model``'s arrivals per second at times ``t``."""
    phase = np.sin(2 * np.pi * (t / DAY_S - model / MODELS))
    diurnal = FLOOR + (1 - FLOOR) * np.maximum(phase, 0.0) ** 4
    minute = ((t % DAY_S) / DAY_S * len(burst)).astype(int)
    return PEAK_PER_S * diurnal * burst[minute]


def main(azure: Path) -> None:
    burst = burst_profile(azure)
    rng = np.random.default_rng(SEED)
    ceiling = PEAK_PER_S * float(burst.max())
    rows: list[tuple[float, str]] = []
    for model in range(MODELS):
        count = rng.poisson(ceiling * DURATION_S)
        times = np.sort(rng.uniform(0.0, DURATION_S, count))
        keep = rng.uniform(0.0, ceiling, count) < rate(model, times, burst)
        rows += [(float(t), f"/m{model + 1}") for t in times[keep]]
    rows.sort()
    with (HERE / "trace.csv").open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["arrival_s", "route"])
        writer.writerows((f"{t:.3f}", route) for t, route in rows)
    print(f"{len(rows)} arrivals over {DURATION_S:.0f} s written to {HERE / 'trace.csv'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else AZURE / "AzureLLMInferenceTrace_conv.csv")
