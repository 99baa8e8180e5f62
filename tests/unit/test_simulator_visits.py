"""The simulator visits only the devices an event touched, and gets what a visit to every
waiting device at every event gets.

After an arrival or a device's own completion only that device and those dispatched to can
start anything; a timer (a batch's delay ending, a stage waiting for minimum residency) or a
warm-up tick may move any device, so those events visit every waiting device. Here a subclass
visits every waiting device at every event, as the loop used to, and the two runs' figures
must be the same to the last digit, on scenarios that batch with delays (thrash, mixed
fleet), batch LLMs continuously (8xa100 with KV) and warm models up (warmup). The control: a
loop that also skips the waiting devices on a timer diverges.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import pytest

from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import load_policy
from hetero.framework.registry import Registry
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.run import _Simulation
from hetero.framework.simulator.workload import Workload

REPO = Path(__file__).resolve().parents[2]

SCENARIOS = {  # policy, workload file, what of the workload is cut
    "thrash": (
        "benchmarks/scenarios/thrash/policy.yaml",
        "benchmarks/scenarios/thrash/workload.yaml",
        {"duration_s": 120.0, "warmup_s": 10.0},
    ),
    "mixed-fleet": (
        "policies/sim/mixed-fleet.yaml",
        "benchmarks/scenarios/mixed-fleet/workload.yaml",
        {"duration_s": 4.0, "warmup_s": 1.0},
    ),
    "8xa100 with KV": (
        "policies/sim/8xa100.yaml",
        "framework/bench/fleet_workload.yaml",
        {"duration_s": 2.0, "warmup_s": 0.5},
    ),
    "warmup": (
        "benchmarks/scenarios/warmup/policy.yaml",
        "benchmarks/scenarios/warmup/workload.yaml",
        {"duration_s": 5400.0, "warmup_s": 1800.0},
    ),
}


class _VisitAll(_Simulation):
    """Every waiting device at every event: the loop before it kept the touched ones."""

    def _start_batches(self, visit_all: bool) -> None:
        super()._start_batches(True)


class _TimerBlind(_Simulation):
    """The control: a timer visits only the touched devices, so a batch whose delay ends
    there does not start until something else touches its device."""

    def _start_batches(self, visit_all: bool) -> None:
        super()._start_batches(False)


@functools.cache  # the loop as shipped runs once per scenario, for its test and the control
def _figures(cls: type[_Simulation], scenario: str, eviction: str) -> dict[str, Any]:
    policy_path, folder, cut = SCENARIOS[scenario]
    policy = load_policy(REPO / policy_path)
    workload = load_workload(REPO / folder)
    workload = Workload(workload.spec.model_copy(update=cut), workload.source)
    fleet = resolve_fleet(policy, Registry(use_entry_points=False))
    simulation = cls(policy, fleet.devices, fleet.topology(), workload, "cost_model", eviction)
    metrics = simulation.run()
    return {
        f.name: dict(value) if isinstance(value, dict) else value
        for f in dataclasses.fields(metrics)
        if f.name not in ("wall_s", "cpu_s") and (value := getattr(metrics, f.name)) is not None
    }


@pytest.mark.parametrize(
    ("scenario", "eviction"),
    [
        ("thrash", "cost_aware"),
        ("mixed-fleet", "cost_aware"),
        ("8xa100 with KV", "cost_aware"),
        ("warmup", "predictive"),
    ],
)
def test_touched_visits_give_the_figures_of_visiting_every_device(
    scenario: str, eviction: str
) -> None:
    touched = _figures(_Simulation, scenario, eviction)
    assert touched["completed"] > 50
    assert touched == _figures(_VisitAll, scenario, eviction)


def test_control_skipping_devices_on_a_timer_diverges() -> None:
    touched = _figures(_Simulation, "mixed-fleet", "cost_aware")
    assert touched != _figures(_TimerBlind, "mixed-fleet", "cost_aware")
