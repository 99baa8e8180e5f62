"""``hetero tune``: the same seed gives the same tuned policy, it validates, and no QoS class
is worse under it than under the shipped one."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml

from hetero.framework.cli.tune import knob_rows
from hetero.framework.fleet import Fleet, resolve_fleet
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.tune import (
    ATTAINMENT_PENALTY_MS,
    DISPATCH_AHEAD_MS,
    KNOBS,
    _figures,
    _no_class_worse,
    _penalised_ms,
    _propose,
    _shipped_params,
    _simulate_all,
    _violations,
    _workers,
    knob_values,
    screen_workload,
    tune,
    variant_knobs,
)
from hetero.framework.simulator.workload import Workload

REPO = Path(__file__).resolve().parents[2]
THRASH = REPO / "benchmarks" / "scenarios" / "thrash"
MIXED = REPO / "policies" / "sim" / "mixed-fleet.yaml"


def test_tuning_is_seeded_validates_and_keeps_every_class(tmp_path: Path) -> None:
    text = (THRASH / "policy.yaml").read_text()
    data = yaml.safe_load(text)
    policy = load_policy_text(text, "thrash.yaml")
    workload_text = (
        (THRASH / "workload.yaml").read_text().replace("duration_s: 1800", "duration_s: 240")
    )
    path = tmp_path / "thrash.yaml"
    path.write_text(workload_text)
    workload = load_workload(path)
    fleet = resolve_fleet(policy, Registry(use_entry_points=False))
    first = tune(data, "thrash.yaml", fleet, workload, trials=3, seed=3)
    second = tune(data, "thrash.yaml", fleet, workload, trials=3, seed=3)
    assert first.text == second.text and first.values == second.values
    load_policy_text(first.text, "tuned.yaml")
    assert _no_class_worse(first.before, first.after)
    assert first.after["p99_ms"] <= first.before["p99_ms"]


def test_a_class_with_lower_attainment_or_a_longer_tail_is_worse() -> None:
    before = {"slo_attainment": {"a": 0.9}, "class_p99_s": {"a": 1.0}}
    assert _no_class_worse(before, {"slo_attainment": {"a": 0.95}, "class_p99_s": {"a": 1.005}})
    assert not _no_class_worse(before, {"slo_attainment": {"a": 0.85}, "class_p99_s": {"a": 0.5}})
    assert not _no_class_worse(before, {"slo_attainment": {"a": 0.95}, "class_p99_s": {"a": 1.2}})


def test_a_screened_search_judges_its_finalists_on_the_whole_workload(tmp_path: Path) -> None:
    """With ``search_s`` the trials run on a cut of the arrivals, but the tuned policy is the
    finalist that is best on the whole workload, compared with the shipped policy there."""
    text = (THRASH / "policy.yaml").read_text()
    policy = load_policy_text(text, "thrash.yaml")
    path = tmp_path / "thrash.yaml"
    path.write_text(
        (THRASH / "workload.yaml").read_text().replace("duration_s: 1800", "duration_s: 240")
    )
    workload = load_workload(path)
    fleet = resolve_fleet(policy, Registry(use_entry_points=False))
    screen = screen_workload(workload, 30.0)
    assert screen.spec.duration_s == workload.spec.warmup_s + 30.0
    assert screen_workload(workload, 1e6) is workload
    result = tune(
        yaml.safe_load(text),
        "thrash.yaml",
        fleet,
        workload,
        trials=3,
        seed=3,
        search_s=30.0,
        finalists=2,
    )
    whole = _figures(policy, fleet, workload)
    assert result.before["p99_ms"] == whole["p99_ms"]  # judged on all of it, not the cut
    assert 0 < result.finalists <= 2 or result.feasible == 0
    assert _no_class_worse(result.before, result.after)
    assert result.after["p99_ms"] <= whole["p99_ms"]
    load_policy_text(result.text, "tuned.yaml")


def _thrash(tmp_path: Path) -> tuple[dict[str, object], Fleet, Workload]:
    text = (THRASH / "policy.yaml").read_text()
    path = tmp_path / "thrash.yaml"
    path.write_text(
        (THRASH / "workload.yaml").read_text().replace("duration_s: 1800", "duration_s: 240")
    )
    fleet = resolve_fleet(load_policy_text(text, "thrash.yaml"), Registry(use_entry_points=False))
    return yaml.safe_load(text), fleet, load_workload(path)


def test_a_trial_in_a_worker_process_gives_the_figures_it_gives_in_process(
    tmp_path: Path,
) -> None:
    """Worker processes are spawned (their own hash seed, their own imports): a trial run there
    must give exactly what it gives here, or ``--jobs`` would change what is judged."""
    data, fleet, workload = _thrash(tmp_path)
    slower = copy.deepcopy(data)
    slower["scheduler"] = {**slower.get("scheduler", {}), "min_residency_s": 90.0}
    here = _simulate_all(None, [data, slower], "thrash.yaml", fleet, workload)
    with _workers(fleet, 2) as pool:
        assert pool is not None
        there = _simulate_all(pool, [data, slower], "thrash.yaml", fleet, workload)
    for mine, theirs in zip(here, there, strict=True):
        timings = ("wall_s", "cpu_s")
        assert {k: v for k, v in mine.items() if k not in timings} == {
            k: v for k, v in theirs.items() if k not in timings
        }
    assert here[0] != here[1]  # the control: the two candidates differ


def test_parallel_tuning_is_seeded_and_searches_each_variants_batching(tmp_path: Path) -> None:
    data, fleet, workload = _thrash(tmp_path)
    policy = load_policy_text(yaml.safe_dump(data), "thrash.yaml")
    knobs = {".".join(knob.path): knob for knob in variant_knobs(policy)}
    batchable = [
        (name, variant_name, variant)
        for name, stage in policy.spec.stages.items()
        for variant_name, variant in stage.variants.items()
        if variant.batchable and variant.max_batch > 1
    ]
    assert batchable, "the thrash policy has a batchable variant"
    for name, variant_name, variant in batchable:
        top = knobs[f"stages.{name}.variants.{variant_name}.max_batch"].high
        assert top == (variant.max_batch if variant.graph is not None else 2 * variant.max_batch)
        assert f"stages.{name}.variants.{variant_name}.max_delay_ms" in knobs
    first = tune(data, "thrash.yaml", fleet, workload, trials=4, seed=5, jobs=2)
    second = tune(data, "thrash.yaml", fleet, workload, trials=4, seed=5, jobs=2)
    assert first.trials == 4
    assert first.text == second.text and first.values == second.values
    assert set(knobs) <= set(first.values)
    load_policy_text(first.text, "tuned.yaml")
    assert _no_class_worse(first.before, first.after)


def test_knob_values_are_the_values_in_force_and_only_changes_are_tabled() -> None:
    """A knob the YAML leaves out reads as its default or fallback, never NaN: a variant's
    unset ``max_delay_ms`` is the policy-wide one, and no ``dispatch_ahead_ms`` reads as off."""
    policy = load_policy_text(MIXED.read_text(), "mixed-fleet.yaml")
    knobs = variant_knobs(policy)
    shipped = knob_values(policy, knobs)
    delay = "stages.llm_decode.variants.full.max_delay_ms"
    assert shipped[delay] == policy.spec.scheduler.batching.max_delay_ms
    assert shipped["stages.llm_decode.variants.full.max_batch"] == 16.0
    assert shipped["stages.ocr.variants.full.max_batch"] == 8.0
    data = yaml.safe_load(MIXED.read_text())
    data["stages"]["ocr"]["variants"]["full"]["max_batch"] = 3
    data["stages"]["llm_decode"]["variants"]["full"]["max_delay_ms"] = 12.5
    tuned = knob_values(load_policy_text(yaml.safe_dump(data), "t.yaml"), knobs)
    assert knob_rows(shipped, tuned) == [
        ("stages.llm_decode.variants.full.max_delay_ms", "5", "12.5"),
        ("stages.ocr.variants.full.max_batch", "8", "3"),
    ]
    ahead = "scheduler.batching.dispatch_ahead_ms"
    (knob,) = [k for k in KNOBS if ".".join(k.path) == ahead]
    assert knob_values(policy, [knob]) == {ahead: math.inf}
    data["scheduler"] = {"batching": {"dispatch_ahead_ms": 150}}
    tuned = knob_values(load_policy_text(yaml.safe_dump(data), "t.yaml"), [knob])
    assert knob_rows(knob_values(policy, [knob]), tuned) == [(ahead, "off", "150")]
    assert knob_rows(shipped, shipped) == []


def test_the_search_starts_from_the_shipped_policy() -> None:
    """The first trial is the shipped policy's values (each brought into its knob's range), so
    the sampler starts from a feasible point; a knob out of range is clamped, not dropped."""
    import optuna

    policy = load_policy_text(MIXED.read_text(), "mixed-fleet.yaml")
    knobs = KNOBS + variant_knobs(policy)
    classes = sorted(policy.spec.qos.classes)
    params = _shipped_params(policy, knobs, classes)
    data = yaml.safe_load(MIXED.read_text())
    proposed = _propose(optuna.trial.FixedTrial(params), data, knobs, classes)
    values = knob_values(load_policy_text(yaml.safe_dump(proposed), "t.yaml"), knobs)
    shipped = knob_values(policy, knobs)
    ahead = "scheduler.batching.dispatch_ahead_ms"
    assert shipped[ahead] == math.inf and values[ahead] == DISPATCH_AHEAD_MS[1]
    assert {k: v for k, v in values.items() if k != ahead} == {
        k: v for k, v in shipped.items() if k != ahead
    }
    assert params["qos.classes.batch.weight"] == policy.spec.qos.classes["batch"].weight


def test_the_sampler_is_told_p99_plus_the_distance_from_feasible() -> None:
    before = {"slo_attainment": {"a": 0.9}, "class_p99_s": {"a": 1.0}}
    ok = {"slo_attainment": {"a": 0.9}, "class_p99_s": {"a": 0.5}}
    assert _penalised_ms(400.0, _violations(before, ok)) == 400.0
    slow = {"slo_attainment": {"a": 0.9}, "class_p99_s": {"a": 1.02}}  # 10 ms over 1.01 s
    assert _penalised_ms(400.0, _violations(before, slow)) == pytest.approx(410.0)
    late = {"slo_attainment": {"a": 0.8}, "class_p99_s": {"a": 0.5}}
    assert _penalised_ms(400.0, _violations(before, late)) == pytest.approx(
        400.0 + 0.1 * ATTAINMENT_PENALTY_MS
    )
