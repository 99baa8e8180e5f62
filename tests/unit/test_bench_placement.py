"""``hetero bench serve --placement``'s parts that need no server: the policies it writes,
the hand-tuned assignment it reads from warm-up timings, and the ratios it reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hetero.framework.bench.serve_load import median_point
from hetero.framework.bench.serve_placement import (
    _fastest_alone,
    assignment_policy,
    counts_since,
    load_named,
    placement_counts,
    placement_ratios,
)
from hetero.framework.bench.serve_stages import SIX_STAGE_SHARES, StageMix
from hetero.framework.policy import load_policy


def test_each_stack_gets_the_bench_policy_with_its_pins_and_the_cache_off(tmp_path: Path) -> None:
    pins = {"text_embed": "openvino", "vision_encode": "onnxruntime"}
    pinned = yaml.safe_load(
        Path(assignment_policy("builtin:bench-serve", tmp_path, "x", pins)).read_text()
    )
    assert pinned["server"]["runtimes"] == pins and pinned["cache"]["enabled"] is False
    free = assignment_policy("builtin:bench-serve", tmp_path, "free", None)
    assert "runtimes" not in yaml.safe_load(Path(free).read_text())["server"]
    assert load_policy(free).spec.server.runtimes == {}  # a valid policy, pins gone


def test_the_hand_tuned_assignment_is_each_stages_fastest_runtime_alone() -> None:
    stages = [
        {
            "stage": "vision_encode",
            "warmup_timings_s": {
                "npu:openvino/CPU": 0.044,
                "npu:onnxruntime/CPUExecutionProvider": 0.015,
                "npu:torch/cpu": "unavailable: no torch",
            },
        },
        {
            "stage": "text_embed",
            "warmup_timings_s": {"npu:openvino/CPU": 0.02, "npu:torch/cpu": 0.9},
        },
    ]
    assert _fastest_alone(stages) == {"vision_encode": "onnxruntime", "text_embed": "openvino"}


def _stack(rates: dict[str, float], startup_s: float = 2.0, rss: float = 300.0) -> dict[str, Any]:
    return {
        "startup_s": startup_s,
        "idle_rss_mb": rss,
        "points": {c: {"req_s": r} for c, r in rates.items()},
    }


def test_free_is_read_against_the_best_pinning_at_each_concurrency() -> None:
    stacks = {
        "pinned:onnxruntime": _stack({"1": 50.0, "8": 40.0}, startup_s=2.0, rss=300.0),
        "pinned:openvino": _stack({"1": 40.0, "8": 50.0}, startup_s=4.0, rss=400.0),
        "hand_tuned": _stack({"1": 50.0, "8": 55.0}),
        "free": _stack({"1": 55.0, "8": 50.0}, startup_s=4.4, rss=440.0),
    }
    ratios, goals = placement_ratios(stacks, [1, 8])
    assert (
        ratios["c1_best_pinning"] == "pinned:onnxruntime"
        and ratios["c1_free_vs_best_pinning"] == 1.1
    )
    assert (
        ratios["c8_best_pinning"] == "pinned:openvino" and ratios["c8_free_vs_best_pinning"] == 1.0
    )
    assert ratios["c8_free_vs_hand_tuned"] == 0.91
    # Start-up and memory against the pinning that is best at the middle concurrency.
    assert ratios["reference_pinning"] == "pinned:openvino"
    assert ratios["free_startup_s_vs_reference"] == 1.1
    met = {name: goal["met"] for name, goal in goals.items()}
    assert met["c8 free placement vs hand-tuned assignment"] is False
    assert met["c1 free placement vs best single-runtime pinning (pinned:onnxruntime)"] is True


def test_a_stacks_figure_is_its_median_round() -> None:
    point = median_point(
        [{"req_s": 30.0, "p99_ms": 9}, {"req_s": 10.0, "p99_ms": 1}, {"req_s": 20.0, "p99_ms": 5}]
    )
    assert point["req_s"] == 20.0 and point["p99_ms"] == 5
    assert point["rounds_req_s"] == [30.0, 10.0, 20.0]


def test_the_six_stage_goal_at_the_middle_concurrency_is_a_tenth_over_the_best_pinning() -> None:
    stacks = {
        "pinned:onnxruntime": _stack({"1": 10.0, "8": 10.0}),
        "free": _stack({"1": 10.5, "8": 10.5}),
    }
    _, goals = placement_ratios(stacks, [1, 8], "six")
    c1 = goals["c1 free placement vs best single-runtime pinning (pinned:onnxruntime)"]
    c8 = goals["c8 free placement vs best single-runtime pinning (pinned:onnxruntime)"]
    assert (c1["goal"], c1["met"]) == (">= 1.0", True)
    assert (c8["goal"], c8["met"]) == (">= 1.1", False)


def test_the_six_stage_mix_asks_every_stage_through_its_pipeline() -> None:
    mix = StageMix("000001")
    stream = mix.stream(0)
    requests = [next(stream) for _ in range(2000)]
    counts = {route: sum(r.route == route for r in requests) for route in mix.routes()}
    for (name, share), route in zip(SIX_STAGE_SHARES, mix.routes(), strict=True):
        assert route == f"/v1/pipelines/{name}"
        assert abs(counts[route] / len(requests) - share) < 0.04
    body = yaml.safe_load(next(r.body for r in requests if r.route.endswith("/chat")))
    assert body["max_tokens"] == 16 and body["inputs"]["text"]
    again = StageMix("000001").stream(0)
    assert [next(again).body for _ in range(50)] == [r.body for r in requests[:50]]


def test_every_point_of_the_six_stage_load_is_sent_the_same_requests() -> None:
    load = load_named("six")
    first, second = load.mix().stream(3), load.mix().stream(3)
    assert [next(first).body for _ in range(40)] == [next(second).body for _ in range(40)]
    other, again = StageMix("another draw").stream(3), load.mix().stream(3)
    # the control: another seed draws other requests
    assert [next(other).route for _ in range(40)] != [next(again).route for _ in range(40)]


def test_an_unknown_load_is_refused() -> None:

    with pytest.raises(ValueError, match="unknown load"):
        load_named("seven")
    assert load_named("six").policy == "builtin:bench-six"


def test_placements_are_counted_per_point_from_the_servers_running_totals() -> None:
    before = placement_counts(
        [
            {"stage": "text_embed", "placements": {"npu:openvino/CPU": 10}},
            {"stage": "vision_encode", "placements": {}},
        ]
    )
    after = placement_counts(
        [
            {"stage": "text_embed", "placements": {"npu:openvino/CPU": 14, "cpu:torch": 3}},
            {"stage": "vision_encode", "placements": {}},
        ]
    )
    # Only what this point placed: the earlier 10 are another point's, an idle stage is left out.
    assert counts_since(before, after) == {"text_embed": {"npu:openvino/CPU": 4, "cpu:torch": 3}}
    assert counts_since(after, after) == {}
