"""The shipped simulator scenarios stand on their own (no ../shared at run time), mixed-fleet
models its LLM's KV cache, and the simulator's speed is reported in CPU time."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hetero.framework.bench.scheduler_sim import measure_simulator
from hetero.framework.policy import load_policy
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.arrivals import check_against_policy
from hetero.framework.simulator.report import ALIASES

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "benchmarks" / "scenarios"


@pytest.mark.parametrize(
    "name", ["ref-8xa100", "mixed-fleet", "thrash", "warmup", "azure-conv", "multimodal"]
)
def test_every_shipped_scenario_loads_from_the_repository(name: str) -> None:
    folder = SCENARIOS / name
    config = yaml.safe_load((folder / "scenario.yaml").read_text())
    policy = load_policy(folder / config["policy"])
    workload = load_workload(folder / config["workload"])
    check_against_policy(workload, policy)  # every route the workload sends exists
    assert set(config["policies"]) <= set(ALIASES)
    if workload.spec.arrivals.path:  # a replayed trace is a file in the repository
        assert (folder / workload.spec.arrivals.path).resolve().is_relative_to(REPO)


def test_the_multimodal_scenario_carries_the_traces_distributions() -> None:
    workload = load_workload(SCENARIOS / "multimodal" / "workload.yaml").spec
    assert workload.arrivals.kind == "gamma" and workload.arrivals.cv > 1.0  # burstier
    prompts = {kind.text_tokens for kind in workload.mix}
    outputs = {kind.output_tokens for kind in workload.mix}
    assert len(prompts) == 4 and len(outputs) == 3  # quantile bins, not one nominal size
    assert sum(kind.weight for kind in workload.mix) == pytest.approx(1.0, abs=1e-3)
    images = {kind.image_pixels for kind in workload.mix if kind.images}
    assert images == {336 * 336, 672 * 672}


def test_mixed_fleet_models_its_llm_decode_with_a_kv_cache() -> None:
    policy = load_policy(REPO / "policies" / "sim" / "mixed-fleet.yaml")
    llm = policy.spec.stages["llm_decode"].variants["full"]
    assert llm.kv_bytes_per_token == 2 * 32 * 4096 * 2  # Llama-2-7B, fp16


def test_simulator_speed_is_reported_per_cpu_second() -> None:
    figures = measure_simulator(hosts=2)  # 16 devices: the same workload, quickly
    assert figures["devices"] == 16
    assert figures["requests"] == 6028
    assert figures["cpu_s"] > 0
    assert figures["requests_per_cpu_s"] == pytest.approx(
        figures["requests"] / figures["cpu_s"], rel=0.01
    )
