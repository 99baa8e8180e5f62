"""``hetero tune POLICY --workload FILE``: search the policy's scheduling knobs on the simulator
(:mod:`hetero.framework.simulator.tune`), write the tuned policy and a before/after table."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import load_policy, load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.simulator import load_workload

ROWS = (("mean ms", "mean_ms"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if value == math.inf:  # a knob's value: dispatch_ahead_ms not set anywhere
        return "off"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def before_after(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The table's rows: overall figures, then each class's attainment and p99."""
    rows = [(label, _fmt(before[key]), _fmt(after[key])) for label, key in ROWS]
    for qos in sorted(before["slo_attainment"]):
        rows.append(
            (
                f"{qos}: SLO attainment",
                _fmt(before["slo_attainment"][qos]),
                _fmt(after["slo_attainment"].get(qos)),
            )
        )
        rows.append(
            (
                f"{qos}: p99 ms",
                _fmt(before["class_p99_s"][qos] * 1e3),
                _fmt(after["class_p99_s"].get(qos, float("nan")) * 1e3),
            )
        )
    return rows


def knob_rows(
    shipped: Mapping[str, float], tuned: Mapping[str, float]
) -> list[tuple[str, str, str]]:
    """The knobs the tuned policy changes: name, shipped value, tuned value (the values in
    force, defaults included, so no row is blank)."""
    return [
        (name, _fmt(shipped[name]), _fmt(tuned[name]))
        for name in sorted(tuned)
        if name in shipped and tuned[name] != shipped[name]
    ]


def run_tune(
    console: Console,
    err: Console,
    registry: Registry,
    policy_path: str,
    workload_path: str,
    out_path: str | None,
    trials: int,
    seed: int,
    timeout_s: float | None,
    search_s: float | None = None,
    finalists: int = 3,
    jobs: int = 1,
) -> int:
    """Tune, write the policy, print the table; 0 when the tuned policy validates."""
    from hetero.framework.simulator.tune import tune

    policy = load_policy(policy_path)
    data = yaml.safe_load(Path(policy_path).read_text(encoding="utf-8"))
    workload = load_workload(workload_path)
    fleet = resolve_fleet(policy, registry)
    with Progress(
        TextColumn("tuning"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best p99 {task.fields[best]:.0f} ms"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task("tune", total=trials, best=float("nan"))

        def progress(done: int, best: float) -> None:
            bar.update(task, completed=done, best=best)

        result = tune(
            data,
            policy_path,
            fleet,
            workload,
            trials=trials,
            seed=seed,
            timeout_s=timeout_s,
            search_s=search_s,
            finalists=finalists,
            jobs=jobs,
            progress=progress,
        )
    target = Path(out_path) if out_path else Path(policy_path).with_suffix(".tuned.yaml")
    screen = "" if search_s is None else f" --search-s {search_s:g} --finalists {finalists}"
    screen += f" --jobs {jobs}" if jobs > 1 else ""
    header = (
        f"# hetero tune {policy_path} --workload {workload_path} --trials {trials} "
        f"--seed {seed}{screen}: p99 {_fmt(result.before['p99_ms'])} -> "
        f"{_fmt(result.after['p99_ms'])} ms, no QoS class worse\n"
    )
    target.write_text(header + result.text, encoding="utf-8")
    load_policy_text(target.read_text(encoding="utf-8"), str(target))  # the tuned policy validates
    table = Table(
        title=f"{policy.spec.name}: shipped vs tuned ({result.feasible} of "
        f"{result.trials} trials feasible"
        + (f", {result.finalists} judged on the whole workload)" if search_s else ")")
    )
    for column in ("figure", "shipped", "tuned"):
        table.add_column(column)
    for row in before_after(dict(result.before), dict(result.after)):
        table.add_row(*row)
    console.print(table)
    changed = knob_rows(result.shipped, result.values)
    if changed:
        knobs = Table(title=f"knobs changed ({len(changed)} of {len(result.values)} searched)")
        for column in ("knob", "shipped", "tuned"):
            knobs.add_column(column)
        for row in changed:
            knobs.add_row(*row)
        console.print(knobs)
    else:
        console.print(
            f"no knob changed: the shipped policy is kept ({len(result.values)} searched)",
            highlight=False,
            markup=False,
        )
    console.print(f"tuned policy written to {target}", highlight=False, markup=False)
    return 0
