"""The pieces that let the scheduler and its benches scale: kept route rows, bench fleets."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.framework.bench.fleet import fleet_policy_text
from hetero.framework.bench.scheduler import bench_policy
from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import costs
from hetero.framework.scheduler.costs import FleetCosts
from hetero.framework.topology import Topology


def _fleet(devices: int) -> FleetCosts:
    specs = simulated_devices(bench_policy(devices).spec.devices.simulated)
    return FleetCosts(specs, Topology(specs), [d.memory_bytes for d in specs])


def test_kept_route_rows_are_the_computed_ones_read_only_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(costs, "ROUTE_ROWS_BYTES", 4 * 16 * 64)  # four rows of 64 devices
    monkeypatch.setattr(costs, "ROUTE_ROWS_LEAST", 1)
    fleet, fresh = _fleet(64), _fleet(64)
    assert fleet.rows_kept == 4
    first = fleet.routes_from(3)
    with pytest.raises(ValueError, match="read-only"):
        first[0][0] = 1.0
    for src in range(64):  # every source once: the first rows are dropped
        fleet.routes_from(src)
    assert len(fleet._rows) == 4
    assert fleet.routes_from(3) is not first  # recomputed, not kept
    for src in (3, 10, 63, 0):
        for kept, computed in zip(fleet.routes_from(src), fresh.routes_from(src), strict=True):
            assert np.array_equal(kept, computed)
    latency, inverse = fleet.routes_from(9)
    assert latency[9] == inverse[9] == 0.0
    assert fleet.route(9, 50) == (float(latency[50]), float(inverse[50]))


def test_every_row_is_built_with_the_tables_when_all_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _fleet(64)  # 64 rows fit the default budget: none is left for a decision to build
    assert len(built._rows) == 64
    rows = {src: built.routes_from(src) for src in range(64)}
    assert all(built.routes_from(src) is rows[src] for src in range(64))  # read, not rebuilt
    monkeypatch.setattr(costs, "ROUTE_ROWS_BYTES", 63 * 16 * 64)  # one row short of all 64
    monkeypatch.setattr(costs, "ROUTE_ROWS_LEAST", 1)
    lazy = _fleet(64)
    assert not lazy._rows  # the control: rows that do not all fit are built when first asked
    for src in range(64):
        for ahead, on_demand in zip(rows[src], lazy.routes_from(src), strict=True):
            assert np.array_equal(ahead, on_demand)


def test_bench_fleets_are_hosts_of_eight_of_every_kind() -> None:
    small = simulated_devices(bench_policy(64).spec.devices.simulated)
    assert len(small) == 64
    assert len({d.host for d in small}) == 8
    large = simulated_devices(bench_policy(1000).spec.devices.simulated)
    assert len(large) == 1000
    assert len({d.host for d in large}) == 125
    assert len({d.vendor_name for d in large}) == len({d.vendor_name for d in small})
    with pytest.raises(ValueError, match="hosts of 8"):
        bench_policy(1001)


def test_the_fleet_bench_scales_the_shipped_1000_device_policy() -> None:
    policy = load_policy_text(fleet_policy_text(2), "fleet")
    devices = simulated_devices(policy.spec.devices.simulated)
    assert len(devices) == 16
    assert len({d.host for d in devices}) == 2
