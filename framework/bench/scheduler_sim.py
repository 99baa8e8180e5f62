"""The simulator's own speed for ``hetero bench scheduler``: requests simulated per second of
the simulating thread's CPU time (``time.thread_time``, which a busy machine does not inflate)
and, beside it, per wall second, on the shipped 1,000-device fleet
(``policies/sim/1000xa100.yaml``) with the fleet bench's workload
(``framework/bench/fleet_workload.yaml``: 6,028 Poisson requests at 300 a second)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hetero.framework.bench.fleet import WORKLOAD, fleet_policy_text
from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import load_policy
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.run import simulate
from hetero.framework.topology import Topology

__all__ = ["SIMULATOR_GOAL_PER_CPU_S", "measure_simulator"]

SIMULATOR_GOAL_PER_CPU_S = 5_000.0
"""Issue 36's goal: simulated requests per CPU second at 1,000 devices."""


def measure_simulator(hosts: int = 125, placement: str = "cost_model") -> dict[str, Any]:
    """One ``simulate()`` of the fleet bench's workload on ``hosts`` hosts of 8 A100s: the
    requests it simulated, its thread CPU and wall seconds, and requests per each."""
    with tempfile.TemporaryDirectory(prefix="hetero-bench-sim-") as folder:
        path = Path(folder) / "fleet.yaml"
        path.write_text(fleet_policy_text(hosts), encoding="utf-8")
        policy = load_policy(path)
    devices = simulated_devices(policy.spec.devices.simulated)
    metrics = simulate(
        policy, devices, Topology(devices), load_workload(WORKLOAD), placement=placement
    )
    requests = metrics.completed + metrics.shed + metrics.failed
    return {
        "devices": len(devices),
        "placement": placement,
        "requests": requests,
        "cpu_s": round(metrics.cpu_s, 3),
        "wall_s": round(metrics.wall_s, 3),
        "requests_per_cpu_s": round(requests / metrics.cpu_s, 1) if metrics.cpu_s else None,
        "requests_per_wall_s": round(requests / metrics.wall_s, 1) if metrics.wall_s else None,
        "goal_requests_per_cpu_s": SIMULATOR_GOAL_PER_CPU_S,
    }
