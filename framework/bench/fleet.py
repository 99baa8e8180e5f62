"""How planning, listing, scheduling and simulating grow with the fleet: 16 to 1,000 devices.

The fleets are ``policies/sim/1000xa100.yaml`` with fewer hosts (8 A100s each, the ref-8xa100
stages), the workload ``fleet_workload.yaml`` beside this module (6,028 Poisson requests at
300 req/s).
Per fleet, one run each:

* ``fleet_s``: generating the policy's simulated device specs (what discovery is to a
  real fleet);
* ``construct_s``: ``Topology`` + ``Scheduler`` over them, the best of three, and the
  ``tracemalloc`` peak of one more, traced, build (``construct_mib``);
* ``plan_s`` and ``devices_s``: the ``hetero plan`` and ``hetero devices --policy --json``
  commands as a user runs them (a fresh process: imports included);
* ``simulate_s`` and ``requests_per_s``: ``simulate()`` in this process, cost model placement,
  its event loop's wall time and simulated requests per wall second.

Growth is each figure at the largest fleet over the smallest.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from hetero.framework.devices import DeviceSpec
from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import Policy, builtin_policy_text, load_policy
from hetero.framework.scheduler.clock import VirtualClock
from hetero.framework.scheduler.scheduler import Scheduler
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.run import simulate
from hetero.framework.topology import Topology

__all__ = ["FLEET_HOSTS", "fleet_policy_text", "run_fleet_bench"]

FLEET_POLICY = "sim/1000xa100"  # shipped in hetero.policies
WORKLOAD = Path(__file__).with_name("fleet_workload.yaml")  # shipped beside this module
FLEET_HOSTS = (2, 16, 125)  # 16, 128 and 1,000 devices
HOSTS_LINE = "hosts: 125"


def fleet_policy_text(hosts: int) -> str:
    """The shipped 1,000-device policy with ``hosts`` hosts of 8 instead of 125."""
    text = builtin_policy_text(FLEET_POLICY)
    if HOSTS_LINE not in text:
        raise ValueError(f"builtin:{FLEET_POLICY}: no {HOSTS_LINE!r} line to scale")
    return text.replace(HOSTS_LINE, f"hosts: {hosts}", 1)


def _command_s(*args: str) -> float:
    """Wall seconds of one ``hetero`` command in a fresh process (it must succeed)."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "hetero.framework.cli", *args],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return time.perf_counter() - started


def _construct(policy: Policy, devices: list[DeviceSpec]) -> tuple[float, Topology]:
    started = time.perf_counter()
    topology = Topology(devices)
    Scheduler(policy, devices, topology, VirtualClock())
    return time.perf_counter() - started, topology


def _one_fleet(path: Path) -> dict[str, Any]:
    policy = load_policy(path)
    started = time.perf_counter()
    devices = simulated_devices(policy.spec.devices.simulated)
    fleet_s = time.perf_counter() - started
    construct_s, topology = min((_construct(policy, devices) for _ in range(3)), key=lambda r: r[0])
    tracemalloc.start()
    _construct(policy, devices)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    metrics = simulate(policy, devices, topology, load_workload(WORKLOAD))
    return {
        "devices": len(devices),
        "hosts": len(topology.hosts),
        "fleet_s": fleet_s,
        "construct_s": construct_s,
        "construct_mib": peak / 2**20,
        "plan_s": _command_s("plan", str(path)),
        "devices_s": _command_s("devices", "--policy", str(path), "--json"),
        "simulate_s": metrics.wall_s,
        "requests": metrics.completed + metrics.shed + metrics.failed,
        "requests_per_s": (metrics.completed + metrics.shed + metrics.failed) / metrics.wall_s,
    }


def run_fleet_bench(hosts: tuple[int, ...] = FLEET_HOSTS) -> dict[str, Any]:
    """Every figure per fleet size, and its growth from the smallest fleet to the largest."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="hetero-fleet-") as folder:
        for count in hosts:
            path = Path(folder) / f"{count * 8}xa100.yaml"
            path.write_text(fleet_policy_text(count), encoding="utf-8")
            rows.append(_one_fleet(path))
    first, last = rows[0], rows[-1]
    growth = {
        key: last[key] / first[key]
        for key in ("fleet_s", "construct_s", "construct_mib", "plan_s", "devices_s", "simulate_s")
        if first[key] > 0
    }
    return {"fleets": rows, "growth": growth, "from": first["devices"], "to": last["devices"]}
