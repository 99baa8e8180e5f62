"""``hetero tune``: search a policy's scheduling knobs on the simulator.

Each trial writes candidate values into a copy of the policy's YAML data, validates it as any
policy is validated, and simulates the workload with hetero's scheduler on the identical
arrivals. The objective is the end-to-end p99; a trial under which any QoS class gets worse
than under the shipped policy (lower SLO attainment, or a class p99 more than
``CLASS_SLACK`` higher) is infeasible. Optuna's TPE sampler proposes the values, seeded, so a
run with the same seed and trial count gives the same tuned policy (a ``timeout_s`` that cuts
trials short does not). Optuna is imported here only: it is the ``sim`` extra.

With ``search_s``, trials simulate only the workload's first ``search_s`` seconds after its
warm-up (the same arrivals, cut short: a cheap screen), and the ``finalists`` best feasible
trials are then simulated on the whole workload and judged there, against the shipped policy
on the whole workload; the tuned policy and the table come from the whole workload only, so a
candidate that only looked good on the screen is never chosen.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from hetero.framework.fleet import Fleet
from hetero.framework.policy import Policy, load_policy_text
from hetero.framework.simulator.report import compare
from hetero.framework.simulator.workload import Workload

__all__ = ["CLASS_SLACK", "KNOBS", "Knob", "TuneResult", "screen_workload", "tune"]

CLASS_SLACK = 0.01
"""A class's p99 may move this much (relative) and still count as no worse."""


@dataclass(frozen=True, slots=True)
class Knob:
    """One scheduling knob: its key path in the policy, its range, and a log scale or not."""

    path: tuple[str, ...]
    low: float
    high: float
    log: bool = False


KNOBS: tuple[Knob, ...] = (
    Knob(("qos", "aging_per_second"), 0.1, 100.0, log=True),
    Knob(("scheduler", "weights", "queue"), 0.25, 4.0, log=True),
    Knob(("scheduler", "weights", "load"), 0.25, 4.0, log=True),
    Knob(("scheduler", "weights", "compute"), 0.25, 4.0, log=True),
    Knob(("scheduler", "weights", "transfer"), 0.25, 4.0, log=True),
    Knob(("scheduler", "min_residency_s"), 0.0, 120.0),
    Knob(("scheduler", "max_load_wait_s"), 0.5, 30.0, log=True),
    Knob(("scheduler", "batching", "max_delay_ms"), 0.0, 50.0),
    Knob(("circuit_breaker", "complexity", "degrade_at"), 0.1, 1.0),
)
"""The knobs searched besides the class weights (``qos.classes.<name>.weight``, 0.5-16)."""


@dataclass(frozen=True, slots=True)
class TuneResult:
    """The tuned policy's YAML text, its values, and both runs' figures."""

    text: str
    values: Mapping[str, float]
    before: Mapping[str, Any]
    after: Mapping[str, Any]
    trials: int
    feasible: int
    finalists: int = 0
    """Trials re-simulated on the whole workload (0 when every trial ran on all of it)."""


def _set(data: dict[str, Any], path: tuple[str, ...], value: float) -> None:
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


def _class_p99(latencies: Mapping[str, list[float]]) -> dict[str, float]:
    return {
        qos: float(np.percentile(values, 99)) if values else 0.0
        for qos, values in sorted(latencies.items())
    }


def _figures(policy: Policy, fleet: Fleet, workload: Workload) -> dict[str, Any]:
    (metrics,) = compare(policy, fleet, workload, ["hetero"])
    summary = metrics.summary()
    summary["class_p99_s"] = _class_p99(metrics.latencies_by_class)
    return summary


def _no_class_worse(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    for qos, attained in before["slo_attainment"].items():
        if after["slo_attainment"].get(qos, 0.0) < attained:
            return False
    for qos, p99 in before["class_p99_s"].items():
        if after["class_p99_s"].get(qos, math.inf) > p99 * (1 + CLASS_SLACK):
            return False
    return True


def screen_workload(workload: Workload, search_s: float) -> Workload:
    """``workload`` with its arrivals stopped ``search_s`` seconds after its warm-up (the same
    seed, so the same arrivals up to there)."""
    spec = workload.spec
    if spec.warmup_s + search_s >= spec.duration_s:
        return workload
    return Workload(
        spec.model_copy(update={"duration_s": spec.warmup_s + search_s}), workload.source
    )


def tune(
    data: Mapping[str, Any],
    source: str,
    fleet: Fleet,
    workload: Workload,
    *,
    trials: int = 30,
    seed: int = 0,
    timeout_s: float | None = None,
    search_s: float | None = None,
    finalists: int = 3,
    progress: Callable[[int, float], None] | None = None,
) -> TuneResult:
    """Search ``data`` (a policy's YAML mapping, from ``source``) for a lower p99 with no class
    worse. ``progress(trial, best_p99_ms)`` is called after each trial (best on the screen
    when ``search_s`` is given)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shipped = load_policy_text(yaml.safe_dump(dict(data)), source)
    screen = workload if search_s is None else screen_workload(workload, search_s)
    before = _figures(shipped, fleet, screen)
    classes = sorted(shipped.spec.qos.classes)

    def candidate(trial: optuna.Trial) -> dict[str, Any]:
        proposed = copy.deepcopy(dict(data))
        for knob in KNOBS:
            name = ".".join(knob.path)
            _set(proposed, knob.path, trial.suggest_float(name, knob.low, knob.high, log=knob.log))
        for qos in classes:
            weight = trial.suggest_float(f"qos.classes.{qos}.weight", 0.5, 16.0, log=True)
            _set(proposed, ("qos", "classes", qos, "weight"), weight)
        return proposed

    feasible: list[tuple[float, int, dict[str, Any], dict[str, Any]]] = []
    best_p99 = float(before["p99_ms"])

    def objective(trial: optuna.Trial) -> float:
        nonlocal best_p99
        proposed = candidate(trial)
        policy = load_policy_text(yaml.safe_dump(proposed), source)
        after = _figures(policy, fleet, screen)
        p99 = after["p99_ms"] if after["p99_ms"] is not None else math.inf
        ok = _no_class_worse(before, after)
        if ok:
            feasible.append((p99, trial.number, proposed, after))
            best_p99 = min(best_p99, p99)
        if progress is not None:
            progress(trial.number + 1, best_p99)
        return p99 if ok else math.inf

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    study.optimize(objective, n_trials=trials, timeout=timeout_s)
    ranked = sorted((p99, number, proposed, after) for p99, number, proposed, after in feasible)
    best: dict[str, Any] = {"p99": before["p99_ms"], "data": dict(data), "after": before}
    judged = 0
    if screen is workload:
        if ranked and ranked[0][0] < best["p99"]:
            best.update(p99=ranked[0][0], data=ranked[0][2], after=ranked[0][3])
    else:
        before = _figures(shipped, fleet, workload)
        best.update(p99=before["p99_ms"], after=before)
        for _, _, proposed, _ in ranked[:finalists]:
            judged += 1
            policy = load_policy_text(yaml.safe_dump(proposed), source)
            after = _figures(policy, fleet, workload)
            if _no_class_worse(before, after) and after["p99_ms"] < best["p99"]:
                best.update(p99=after["p99_ms"], data=proposed, after=after)
    values = {".".join(knob.path): float(_get(best["data"], knob.path)) for knob in KNOBS}
    return TuneResult(
        text=yaml.safe_dump(best["data"], sort_keys=False),
        values=values,
        before=before,
        after=best["after"],
        trials=len(study.trials),
        feasible=len(feasible),
        finalists=judged,
    )


def _get(data: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = data
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return math.nan
        node = node[key]
    return node
