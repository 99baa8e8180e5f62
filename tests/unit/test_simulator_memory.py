"""The simulator's memory figures, kept incrementally, equal a full recomputation at every event.

The event loop re-reads a device's resident bytes only where a dispatch, a warm-up load or a
release moved them, visits only devices with a running KV batch, and reuses the utilisation
figures while the vector stays the same. Here a subclass recomputes the vector as the loop used
to (every device's bytes, every device's KV usage) at each event and compares. The warm-up
scenario loads, evicts, prefetches and releases; the thrash scenario evicts under pressure.
The control: a simulation that forgets to mark one dispatch's device diverges.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import load_policy
from hetero.framework.registry import Registry
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.run import _Simulation
from hetero.framework.simulator.workload import Workload

REPO = Path(__file__).resolve().parents[2]


class _Checked(_Simulation):
    """Compares the incremental vector with a full recomputation at each observation."""

    checks = 0
    mismatches = 0

    def _observe_memory(self, when: float) -> None:
        super()._observe_memory(when)
        if when < self.workload.spec.warmup_s:
            return
        used = np.array([m.model_bytes for m in self.scheduler.memory], dtype=float)
        for index, device_id in enumerate(self.devices):
            used[index] += self.kv.usage(device_id, when)[0]
        assert self.last_used is not None
        _Checked.checks += 1
        if not np.array_equal(used, self.last_used):
            _Checked.mismatches += 1


class _Forgetful(_Checked):
    """The control: the first dispatch that loads a model is not marked as moving memory."""

    forgot = False

    def _dispatch(self) -> None:
        before = set(self.memory_moved)
        super()._dispatch()
        if not _Forgetful.forgot and self.memory_moved - before:
            self.memory_moved = before
            _Forgetful.forgot = True


SCENARIOS = {  # policy, workload file
    "warmup": (
        "benchmarks/scenarios/warmup/policy.yaml",
        "benchmarks/scenarios/warmup/workload.yaml",
    ),
    "thrash": (
        "benchmarks/scenarios/thrash/policy.yaml",
        "benchmarks/scenarios/thrash/workload.yaml",
    ),
    "8xa100 with KV": ("policies/sim/8xa100.yaml", "framework/bench/fleet_workload.yaml"),
}


def _run(cls: type[_Checked], scenario: str, placement: str, eviction: str, **spec: Any) -> None:
    policy_path, workload_file = SCENARIOS[scenario]
    policy = load_policy(REPO / policy_path)
    workload = load_workload(REPO / workload_file)
    workload = Workload(workload.spec.model_copy(update=spec), workload.source)
    fleet = resolve_fleet(policy, Registry(use_entry_points=False))
    simulation = cls(policy, fleet.devices, fleet.topology(), workload, placement, eviction)
    simulation.run()


@pytest.mark.parametrize(
    ("scenario", "eviction", "spec"),
    [
        ("warmup", "predictive", {"duration_s": 5400.0, "warmup_s": 1800.0}),
        ("thrash", "cost_aware", {"duration_s": 120.0, "warmup_s": 10.0}),
        ("8xa100 with KV", "cost_aware", {"duration_s": 2.0, "warmup_s": 0.5}),
    ],
)
def test_incremental_memory_equals_a_full_recomputation(
    scenario: str, eviction: str, spec: dict[str, float]
) -> None:
    _Checked.checks = _Checked.mismatches = 0
    _run(_Checked, scenario, "cost_model", eviction, **spec)
    assert _Checked.checks > 100
    assert _Checked.mismatches == 0


def test_control_a_forgotten_device_diverges() -> None:
    _Checked.checks = _Checked.mismatches = 0
    _Forgetful.forgot = False
    _run(_Forgetful, "thrash", "cost_model", "cost_aware", duration_s=120.0, warmup_s=0.0)
    assert _Forgetful.forgot
    assert _Checked.mismatches > 0
