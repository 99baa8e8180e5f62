"""The sim backend's calibration figures are the ones the measured traces give (when the
third-party trace files are present beside the repository), and the LLM model uses them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetero.backends.sim.calibration import (
    LOAD_SPREAD,
    ROOFLINE_EFFICIENCY,
    efficiency_for,
    fit_load_spread,
    fit_splitwise,
    load_multiplier,
)

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "data" / "traces"
# MIT-licensed, so it ships in the repository (benchmarks/data/splitwise_perf_model/LICENSE-MIT.txt)
SPLITWISE = REPO / "benchmarks" / "data" / "splitwise_perf_model" / "perf_model.csv"
# No licence for redistribution (research use only): read where the shared traces are
ALIBABA = TRACES / "alibaba_gentd26" / "basemodel_update_latency_anon.tar.gz"


def test_efficiencies_are_the_ones_the_splitwise_table_gives() -> None:
    assert fit_splitwise(SPLITWISE) == dict(ROOFLINE_EFFICIENCY)


@pytest.mark.skipif(not ALIBABA.exists(), reason="alibaba trace not present")
def test_load_spread_is_the_one_the_alibaba_loads_give() -> None:
    assert fit_load_spread(ALIBABA) == LOAD_SPREAD


def test_uncovered_devices_take_the_mean_and_draws_cover_the_spread() -> None:
    a100, h100 = ROOFLINE_EFFICIENCY["A100-SXM4-80GB"], ROOFLINE_EFFICIENCY["H100-SXM5-80GB"]
    other = efficiency_for("MI300X")
    assert other.decode == pytest.approx((a100.decode + h100.decode) / 2)
    assert efficiency_for("A100-SXM4-80GB") == a100
    draws = [load_multiplier(i / 1000) for i in range(1000)]
    assert min(draws) == LOAD_SPREAD[0] and max(draws) == LOAD_SPREAD[-1]
