"""``hetero tune``: search a policy's scheduling knobs on the simulator.

Each trial writes candidate values into a copy of the policy's YAML data, validates it as any
policy is validated, and simulates the workload with hetero's scheduler on the identical
arrivals. The objective is the end-to-end p99; a trial under which any QoS class gets worse
than under the shipped policy (lower SLO attainment, or a class p99 more than
``CLASS_SLACK`` higher) is infeasible. Optuna's TPE sampler proposes the values, seeded, so a
run with the same seed and trial count gives the same tuned policy (a ``timeout_s`` that cuts
trials short does not). Optuna is imported here only: it is the ``sim`` extra. The first
trials are the shipped policy and a sweep of the policy-wide ``dispatch_ahead_ms``
(:data:`AHEAD_SWEEP_MS`) with every other knob as shipped; the sampler is told each trial's
p99 plus how far it is from feasible (:func:`_penalised_ms`), so a trial that won p99 while a
class lost a little still shows where p99 was won; only a feasible trial is ever chosen.

With ``search_s``, trials simulate only the workload's first ``search_s`` seconds after its
warm-up (the same arrivals, cut short: a cheap screen), and the ``finalists`` best feasible
trials are then simulated on the whole workload and judged there, against the shipped policy
on the whole workload; the tuned policy and the table come from the whole workload only, so a
candidate that only looked good on the screen is never chosen.

Besides the policy-wide knobs (:data:`KNOBS`) and the class weights, every batchable stage
variant's own batching is searched (:func:`variant_knobs`): its ``max_delay_ms`` and its
``max_batch`` (at most the declared figure for a variant a real graph serves, whose graph may
not take more; up to twice it for a figures-only, simulated variant).

With ``jobs`` > 1 trials are simulated in that many worker processes, ``jobs`` at a time: the
sampler proposes a whole round before it hears any of its results (Optuna's ask-and-tell), so
the tuned policy depends on the seed, the trial count and ``jobs``, and is the same for the
same three.
"""

from __future__ import annotations

import copy
import math
import multiprocessing
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from hetero.framework.fleet import Fleet
from hetero.framework.policy import Policy, load_policy_text
from hetero.framework.simulator.report import compare
from hetero.framework.simulator.workload import Workload

__all__ = [
    "CLASS_SLACK",
    "KNOBS",
    "Knob",
    "TuneResult",
    "knob_values",
    "screen_workload",
    "tune",
    "variant_knobs",
]

CLASS_SLACK = 0.01
"""A class's p99 may move this much (relative) and still count as no worse."""

ATTAINMENT_PENALTY_MS = 10_000.0
"""What the sampler is told a whole SLO attainment lost costs, in p99 milliseconds."""


@dataclass(frozen=True, slots=True)
class Knob:
    """One scheduling knob: its key path in the policy, its range, and a log scale or not."""

    path: tuple[str, ...]
    low: float
    high: float
    log: bool = False
    integer: bool = False


MAX_DELAY_MS = 50.0
"""The upper end searched for a ``max_delay_ms``, policy-wide or a variant's."""

AHEAD_SWEEP_MS = (50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0)
"""The policy-wide ``dispatch_ahead_ms`` values tried first, each with every other knob as
shipped: the sampler's random start seldom draws the narrow band where late binding pays
(on the mixed fleet about 120-170 ms) together with the other knobs near values that keep
every class whole, so the search starts from this sweep along it."""

DISPATCH_AHEAD_MS = (10.0, 10_000.0)
"""The range searched for the policy-wide ``dispatch_ahead_ms`` (log scale): from a part of a
batch to more than any batch here takes, which is the same as none."""

KNOBS: tuple[Knob, ...] = (
    Knob(("qos", "aging_per_second"), 0.1, 100.0, log=True),
    Knob(("scheduler", "weights", "queue"), 0.25, 4.0, log=True),
    Knob(("scheduler", "weights", "load"), 0.25, 4.0, log=True),
    Knob(("scheduler", "weights", "compute"), 0.25, 4.0, log=True),
    Knob(("scheduler", "weights", "transfer"), 0.25, 4.0, log=True),
    Knob(("scheduler", "min_residency_s"), 0.0, 120.0),
    Knob(("scheduler", "max_load_wait_s"), 0.5, 30.0, log=True),
    Knob(("scheduler", "batching", "max_delay_ms"), 0.0, MAX_DELAY_MS),
    Knob(("scheduler", "batching", "dispatch_ahead_ms"), *DISPATCH_AHEAD_MS, log=True),
    Knob(("circuit_breaker", "complexity", "degrade_at"), 0.1, 1.0),
)
"""The policy-wide knobs searched besides the class weights (``qos.classes.<name>.weight``,
0.5-16) and each batchable variant's own batching (:func:`variant_knobs`)."""


def variant_knobs(policy: Policy) -> tuple[Knob, ...]:
    """Each batchable variant's ``max_delay_ms`` and ``max_batch``; ``max_batch`` ranges up to
    the declared figure where a real graph serves the variant, up to twice it otherwise."""
    knobs: list[Knob] = []
    for stage_name, stage in sorted(policy.spec.stages.items()):
        for variant_name, variant in sorted(stage.variants.items()):
            if not variant.batchable or variant.max_batch <= 1:
                continue
            base = ("stages", stage_name, "variants", variant_name)
            top = variant.max_batch if variant.graph is not None else 2 * variant.max_batch
            knobs.append(Knob((*base, "max_delay_ms"), 0.0, MAX_DELAY_MS))
            knobs.append(Knob((*base, "max_batch"), 1, top, log=True, integer=True))
    return tuple(knobs)


@dataclass(frozen=True, slots=True)
class TuneResult:
    """The tuned policy's YAML text, its values, and both runs' figures."""

    text: str
    values: Mapping[str, float]
    """Each searched knob's value in the tuned policy (the value in force: a default or a
    fallback where the YAML does not set it)."""
    shipped: Mapping[str, float]
    """The same knobs' values in the shipped policy."""
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


def _violations(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[list[float], list[float]]:
    """How far each class is from "no worse" (feasible where every value is <= 0): the SLO
    attainment each class lost, and each class's p99 over the shipped one's plus
    ``CLASS_SLACK``, in seconds."""
    attainment = [
        attained - after["slo_attainment"].get(qos, 0.0)
        for qos, attained in sorted(before["slo_attainment"].items())
    ]
    tails = [
        after["class_p99_s"].get(qos, math.inf) - p99 * (1 + CLASS_SLACK)
        for qos, p99 in sorted(before["class_p99_s"].items())
    ]
    return attainment, tails


def _no_class_worse(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    attainment, tails = _violations(before, after)
    return all(value <= 0 for value in attainment + tails)


def _penalised_ms(p99_ms: float, violations: tuple[list[float], list[float]]) -> float:
    """What the sampler is told a trial scored: its p99 plus how far it is from feasible (SLO
    attainment lost at ``ATTAINMENT_PENALTY_MS`` per whole attainment, each class's excess
    p99 millisecond for millisecond). A trial that won p99 while a class lost a little so
    still shows the sampler where p99 was won; only feasible trials can be chosen."""
    attainment, tails = violations
    return (
        p99_ms
        + ATTAINMENT_PENALTY_MS * sum(max(0.0, v) for v in attainment)
        + 1e3 * sum(max(0.0, v) for v in tails)
    )


def screen_workload(workload: Workload, search_s: float) -> Workload:
    """``workload`` with its arrivals stopped ``search_s`` seconds after its warm-up (the same
    seed, so the same arrivals up to there)."""
    spec = workload.spec
    if spec.warmup_s + search_s >= spec.duration_s:
        return workload
    return Workload(
        spec.model_copy(update={"duration_s": spec.warmup_s + search_s}), workload.source
    )


_WORKER: dict[str, Fleet] = {}
"""A worker process's fleet, set once by its initializer."""


def _init_worker(fleet: Fleet) -> None:
    _WORKER["fleet"] = fleet


def _simulate_text(text: str, source: str, workload: Workload) -> dict[str, Any]:
    """A worker's trial: the candidate policy's figures (the fleet came with the worker)."""
    return _figures(load_policy_text(text, source), _WORKER["fleet"], workload)


@contextmanager
def _workers(fleet: Fleet, jobs: int) -> Iterator[Executor | None]:
    """``jobs`` spawned worker processes holding the fleet, or None for in-process trials.
    Spawned, not forked: the caller may have threads running (a progress bar's)."""
    if jobs <= 1:
        yield None
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        jobs, mp_context=context, initializer=_init_worker, initargs=(fleet,)
    ) as pool:
        yield pool


def _simulate_all(
    pool: Executor | None,
    candidates: Sequence[dict[str, Any]],
    source: str,
    fleet: Fleet,
    workload: Workload,
) -> list[dict[str, Any]]:
    texts = [yaml.safe_dump(candidate) for candidate in candidates]
    if pool is None:
        return [_figures(load_policy_text(text, source), fleet, workload) for text in texts]
    futures = [pool.submit(_simulate_text, text, source, workload) for text in texts]
    return [future.result() for future in futures]


def _shipped_params(
    shipped: Policy, knobs: Sequence[Knob], classes: Sequence[str]
) -> dict[str, float]:
    """The shipped policy's values as trial parameters, each brought into its knob's range
    (no ``dispatch_ahead_ms`` is the range's top, more than any batch here takes): the first
    trial, so the sampler starts from a feasible point."""
    values = knob_values(shipped, knobs)
    params: dict[str, float] = {}
    for knob in knobs:
        name = ".".join(knob.path)
        value = min(max(values[name], knob.low), knob.high)
        params[name] = int(value) if knob.integer else value
    for qos in classes:
        weight = shipped.spec.qos.classes[qos].weight
        params[f"qos.classes.{qos}.weight"] = min(max(weight, 0.5), 16.0)
    return params


def _propose(
    trial: Any, data: Mapping[str, Any], knobs: Sequence[Knob], classes: Sequence[str]
) -> dict[str, Any]:
    """A copy of ``data`` with the values ``trial`` (an Optuna trial) suggests."""
    proposed = copy.deepcopy(dict(data))
    for knob in knobs:
        name = ".".join(knob.path)
        value: float
        if knob.integer:
            value = trial.suggest_int(name, int(knob.low), int(knob.high), log=knob.log)
        else:
            value = trial.suggest_float(name, knob.low, knob.high, log=knob.log)
        _set(proposed, knob.path, value)
    for qos in classes:
        weight = trial.suggest_float(f"qos.classes.{qos}.weight", 0.5, 16.0, log=True)
        _set(proposed, ("qos", "classes", qos, "weight"), weight)
    return proposed


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
    jobs: int = 1,
    progress: Callable[[int, float], None] | None = None,
) -> TuneResult:
    """Search ``data`` (a policy's YAML mapping, from ``source``) for a lower p99 with no class
    worse, simulating ``jobs`` trials at a time. ``progress(trial, best_p99_ms)`` is called
    after each trial (best on the screen when ``search_s`` is given)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shipped = load_policy_text(yaml.safe_dump(dict(data)), source)
    screen = workload if search_s is None else screen_workload(workload, search_s)
    classes = sorted(shipped.spec.qos.classes)
    knobs = KNOBS + variant_knobs(shipped)

    feasible: list[tuple[float, int, dict[str, Any], dict[str, Any]]] = []
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    start = _shipped_params(shipped, knobs, classes)
    study.enqueue_trial(start)
    for ahead_ms in AHEAD_SWEEP_MS[: max(0, trials - 1)]:
        study.enqueue_trial({**start, "scheduler.batching.dispatch_ahead_ms": ahead_ms})
    told = 0  # trials asked and told (the study also lists the enqueued ones not yet asked)
    deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
    best: dict[str, Any]
    judged = 0
    with _workers(fleet, jobs) as pool:
        before = _figures(shipped, fleet, screen)
        best_p99 = float(before["p99_ms"])
        while told < trials and time.monotonic() < deadline:
            asked = [study.ask() for _ in range(min(max(jobs, 1), trials - told))]
            told += len(asked)
            proposals = [_propose(trial, data, knobs, classes) for trial in asked]
            for trial, proposed, after in zip(
                asked,
                proposals,
                _simulate_all(pool, proposals, source, fleet, screen),
                strict=True,
            ):
                p99 = after["p99_ms"] if after["p99_ms"] is not None else math.inf
                violations = _violations(before, after)
                if _no_class_worse(before, after):
                    feasible.append((p99, trial.number, proposed, after))
                    best_p99 = min(best_p99, p99)
                study.tell(trial, _penalised_ms(p99, violations))
                if progress is not None:
                    progress(trial.number + 1, best_p99)
        ranked = sorted(feasible, key=lambda entry: (entry[0], entry[1]))
        best = {"p99": before["p99_ms"], "data": dict(data), "after": before}
        if screen is workload:
            if ranked and ranked[0][0] < best["p99"]:
                best.update(p99=ranked[0][0], data=ranked[0][2], after=ranked[0][3])
        else:
            before = _figures(shipped, fleet, workload)
            best.update(p99=before["p99_ms"], after=before)
            chosen = [proposed for _, _, proposed, _ in ranked[:finalists]]
            judged = len(chosen)
            for proposed, after in zip(
                chosen,
                _simulate_all(pool, chosen, source, fleet, workload),
                strict=True,
            ):
                if _no_class_worse(before, after) and after["p99_ms"] < best["p99"]:
                    best.update(p99=after["p99_ms"], data=proposed, after=after)
    tuned = load_policy_text(yaml.safe_dump(best["data"]), source)
    return TuneResult(
        text=yaml.safe_dump(best["data"], sort_keys=False),
        values=knob_values(tuned, knobs),
        shipped=knob_values(shipped, knobs),
        before=before,
        after=best["after"],
        trials=told,
        feasible=len(feasible),
        finalists=judged,
    )


def knob_values(policy: Policy, knobs: Sequence[Knob]) -> dict[str, float]:
    """Each knob's value in force in the validated ``policy``: the YAML's, else the schema's
    default; a variant's unset ``max_delay_ms`` or ``dispatch_ahead_ms`` is the policy-wide one
    it falls back to, and no ``dispatch_ahead_ms`` at all is infinity."""
    values: dict[str, float] = {}
    for knob in knobs:
        node: Any = policy.spec
        for key in knob.path:
            node = node[key] if isinstance(node, Mapping) else getattr(node, key)
        if node is None and knob.path[-1] in ("max_delay_ms", "dispatch_ahead_ms"):
            node = getattr(policy.spec.scheduler.batching, knob.path[-1])
        values[".".join(knob.path)] = math.inf if node is None else float(node)
    return values
