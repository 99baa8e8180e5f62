"""The simulator on tiny fleets: determinism, overload, thrash, workload readers, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hetero.framework.errors import PolicyValidationError
from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import Policy, load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.simulator import load_workload, simulate
from hetero.framework.simulator.arrivals import RequestSource, open_loop_requests
from hetero.framework.simulator.report import compare
from hetero.framework.simulator.traces import read_azure, read_trace

REPO = Path(__file__).resolve().parents[2]

POLICY = """\
version: 1
devices:
  simulated:
    - {name: g, preset: H100-SXM5-80GB, count: 2, host: a}
    - {name: m, preset: MI300X, count: 1, host: b}
stages:
  enc:
    modality: image
    variants:
      full: {flops_per_item: 400 GFLOPS, bytes_per_item: 1 GB, resident_bytes: 2 GB,
             output_bytes: 1 MB, max_batch: 8, dtype: fp16}
  llm:
    modality: text
    variants:
      full: {flops_per_item: 2 TFLOPS, bytes_per_item: 30 GB, resident_bytes: 20 GB,
             max_batch: 8, dtype: fp16}
pipelines:
  ask: {steps: [{stage: enc}, {stage: llm}]}
routes: {/ask: ask, /chat: llm}
qos:
  default_class: standard
  classes:
    standard: {weight: 4, sla_tier: t, queue_bound: 50}
    batch: {weight: 1, sla_tier: t, queue_bound: 50}
sla_tiers: {t: {deadline_ms: 2000}}
"""

WORKLOAD = """\
name: tiny
seed: 4
duration_s: 30
arrivals: {kind: poisson, rate_per_s: 20}
mix:
  - {route: /ask, weight: 2, images: 1, image_pixels: 112896, text_tokens: 500, output_tokens: 100}
  - {route: /chat, weight: 1, qos: batch, text_tokens: 300, output_tokens: 200}
"""


def setup(
    tmp_path: Path, workload: str = WORKLOAD, policy: str = POLICY
) -> tuple[Policy, object, object]:
    policy_obj = load_policy_text(policy, "sim.yaml")
    path = tmp_path / "workload.yaml"
    path.write_text(workload)
    return (
        policy_obj,
        resolve_fleet(policy_obj, Registry(use_entry_points=False)),
        load_workload(path),
    )


def test_every_policy_sees_the_same_arrivals_and_runs_repeat_exactly(tmp_path: Path) -> None:
    policy, fleet, workload = setup(tmp_path)
    first = open_loop_requests(workload, policy)  # type: ignore[arg-type]
    assert first == open_loop_requests(workload, policy)  # type: ignore[arg-type]
    assert len(first) > 400 and all(r.arrival <= 30 for r in first)
    runs = [
        simulate(policy, fleet.devices, fleet.topology(), workload).summary()  # type: ignore[attr-defined]
        for _ in range(2)
    ]
    for run in runs:
        run.pop("wall_s")
        run.pop("cpu_s")
    assert runs[0] == runs[1]
    assert runs[0]["completed"] == len(first) and runs[0]["failed"] == 0


def test_policies_side_by_side_complete_the_same_work(tmp_path: Path) -> None:
    policy, fleet, workload = setup(tmp_path)
    results = compare(policy, fleet, workload, ["hetero", "round_robin", "least_connections"])  # type: ignore[arg-type]
    completed = {m.policy: m.completed for m in results}
    assert len(set(completed.values())) == 1
    summary = results[0].summary()
    for key in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "p99_minus_p50_ms", "ttft_p50_ms"):
        assert summary[key] > 0
    assert summary["model_loads"] >= 2
    assert set(summary["slo_attainment"]) == {"standard", "batch"}


def test_an_overloaded_fleet_finishes_and_reports_sheds(tmp_path: Path) -> None:
    heavy = WORKLOAD.replace("rate_per_s: 20", "rate_per_s: 2000").replace(
        "duration_s: 30", "duration_s: 2"
    )
    policy, fleet, workload = setup(tmp_path, heavy)
    metrics = simulate(policy, fleet.devices, fleet.topology(), workload)  # type: ignore[attr-defined]
    arrivals = len(open_loop_requests(workload, policy))  # type: ignore[arg-type]
    assert metrics.shed > 0
    assert metrics.completed + metrics.shed + metrics.failed == arrivals


def test_closed_loop_and_gamma_arrivals(tmp_path: Path) -> None:
    closed = WORKLOAD.replace(
        "arrivals: {kind: poisson, rate_per_s: 20}", "arrivals: {kind: closed_loop, clients: 4}"
    )
    policy, fleet, workload = setup(tmp_path, closed)
    metrics = simulate(policy, fleet.devices, fleet.topology(), workload)  # type: ignore[attr-defined]
    assert metrics.completed > 100
    bursty = WORKLOAD.replace("kind: poisson, rate_per_s: 20", "kind: gamma, rate_per_s: 20, cv: 3")
    _, _, gamma = setup(tmp_path, bursty)
    source = RequestSource(gamma)  # type: ignore[arg-type]
    gaps = np.array([source.gap() for _ in range(20000)])
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(3, rel=0.15)


def test_cost_aware_eviction_loads_less_than_lru_and_the_residency_bound_trades_loads_for_tail(
    tmp_path: Path,
) -> None:
    scenario = REPO / "benchmarks" / "scenarios" / "thrash"
    text = (scenario / "policy.yaml").read_text()
    workload_text = (scenario / "workload.yaml").read_text()
    path = tmp_path / "thrash.yaml"
    path.write_text(workload_text.replace("duration_s: 1800", "duration_s: 300"))
    workload = load_workload(path)
    policy = load_policy_text(text, "thrash.yaml")
    fleet = resolve_fleet(policy, Registry(use_entry_points=False))
    hetero, lru = (m.summary() for m in compare(policy, fleet, workload, ["hetero", "lru"]))
    assert hetero["model_loads"] < 0.8 * lru["model_loads"]
    assert hetero["lowest_class_max_wait_s"] <= lru["lowest_class_max_wait_s"]
    # A residency wall (the bound as long as min residency) loads far less, waits far longer.
    walled = load_policy_text(text.replace("max_load_wait_s: 1.75", "max_load_wait_s: 45"), "w")
    (wall,) = (m.summary() for m in compare(walled, fleet, workload, ["hetero"]))
    assert wall["model_loads"] * 5 < lru["model_loads"]
    assert wall["lowest_class_max_wait_s"] > 5 * hetero["lowest_class_max_wait_s"]


def test_trace_reader_names_file_and_line_of_bad_rows(tmp_path: Path) -> None:
    routes = {"/ask", "/chat"}
    good = tmp_path / "t.csv"
    good.write_text("arrival_s,route,text_tokens\n0.0,/ask,10\n0.5,/chat,\n")
    assert [r.route for r in read_trace(good, routes)] == ["/ask", "/chat"]
    cases = {
        "route_missing.csv": ("arrival_s,text_tokens\n0,1\n", ":1: missing column(s): route"),
        "negative.csv": ("arrival_s,route\n-1,/ask\n", ":2: arrival_s: must not be negative"),
        "unsorted.csv": ("arrival_s,route\n2,/ask\n1,/ask\n", ":3: arrival_s: 1.0 is before"),
        "unknown.csv": ("arrival_s,route\n0,/nope\n", ":2: route: '/nope' is not a route"),
        "word.csv": ("arrival_s,route,images\n0,/ask,two\n", ":2: images: expected a number"),
        "bad.jsonl": (
            '{"arrival_s": 0, "route": "/ask"}\n[1]\n',
            ":2: each line must be a JSON object",
        ),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(PolicyValidationError) as caught:
            read_trace(path, routes)
        assert message in str(caught.value), name
        assert str(path) in str(caught.value)


def test_azure_reader_reads_the_shipped_trace() -> None:
    rows = read_azure(REPO / "benchmarks/data/azure_llm_2023/AzureLLMInferenceTrace_conv.csv", 500)
    assert len(rows) == 500
    arrivals = [r[0] for r in rows]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    assert all(context > 0 and generated >= 0 for _, context, generated in rows)


@pytest.mark.parametrize(
    ("edit", "key_path", "problem"),
    [
        (("rate_per_s: 20", "rate_per_s: -2"), "arrivals.rate_per_s", "expected a positive number"),
        (
            ("arrivals: {kind: poisson, rate_per_s: 20}", "arrivals: {kind: poisson}"),
            "arrivals",
            "need rate_per_s",
        ),
        (("seed: 4", "seed: 4\nsede: 5"), "sede", "unknown key 'sede'"),
        (("kind: poisson", "kind: lognormal"), "arrivals.kind", "expected 'poisson'"),
    ],
)
def test_bad_workload_files_name_line_and_key(
    tmp_path: Path, edit: tuple[str, str], key_path: str, problem: str
) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD.replace(*edit))
    with pytest.raises(PolicyValidationError) as caught:
        load_workload(path)
    assert caught.value.key_path == key_path
    assert problem in caught.value.problem
    assert caught.value.line is not None


def test_a_mix_route_the_policy_lacks_is_named(tmp_path: Path) -> None:
    policy, _, workload = setup(tmp_path, WORKLOAD.replace("route: /chat", "route: /talk"))
    with pytest.raises(PolicyValidationError, match="'/talk' is not a route"):
        open_loop_requests(workload, policy)  # type: ignore[arg-type]


def test_a_route_no_device_can_serve_fails_fast_without_hanging(tmp_path: Path) -> None:
    npu_only = POLICY.replace(
        "  llm:\n    modality: text\n", "  llm:\n    modality: text\n    device_classes: [npu]\n"
    )
    closed = WORKLOAD.replace(
        "arrivals: {kind: poisson, rate_per_s: 20}", "arrivals: {kind: closed_loop, clients: 3}"
    )
    policy, fleet, workload = setup(tmp_path, closed, npu_only)
    metrics = simulate(policy, fleet.devices, fleet.topology(), workload)  # type: ignore[attr-defined]
    assert metrics.failed > 0  # refused requests back off one second: virtual time moves on
    assert metrics.summary()["slo_attainment"]["standard"] == 0.0  # failures are misses


def test_sheds_count_as_slo_misses_and_json_has_no_nan(tmp_path: Path) -> None:
    import json

    heavy = WORKLOAD.replace("rate_per_s: 20", "rate_per_s: 2000").replace(
        "duration_s: 30", "duration_s: 2"
    )
    policy, fleet, workload = setup(tmp_path, heavy)
    summary = simulate(policy, fleet.devices, fleet.topology(), workload).summary()  # type: ignore[attr-defined]
    assert summary["shed"] > 0
    assert summary["slo_attainment"]["standard"] < 1.0
    json.loads(json.dumps(summary), parse_constant=lambda name: pytest.fail(f"{name} in JSON"))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("route: /chat, weight: 1, qos: batch", "route: /chat, weight: 1, qos: gold"),
            "'gold' is not a QoS class",
        ),
        (
            (
                "arrivals: {kind: poisson, rate_per_s: 20}",
                "arrivals: {kind: azure, path: t.csv}\nazure: {route: /chat, audio_ratio: 0.2}",
            ),
            "needs a mix entry with audio_seconds",
        ),
    ],
)
def test_workload_names_checked_against_the_policy(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    with pytest.raises(PolicyValidationError, match=message):
        policy, fleet, workload = setup(tmp_path, WORKLOAD.replace(*edit))
        simulate(policy, fleet.devices, fleet.topology(), workload)  # type: ignore[attr-defined]
