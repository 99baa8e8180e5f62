"""amdsmi readings to DeviceSpec and xGMI topology: a recorded MI300X node, no GPU needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetero.backends.rocm import translate
from hetero.backends.rocm.readings import AmdSmiReadings, PairReading
from hetero.framework.devices import LinkKind
from hetero.framework.topology import Topology

READINGS = Path(__file__).parent / "readings"


def mi300x() -> AmdSmiReadings:
    return AmdSmiReadings.from_json(json.loads((READINGS / "amdsmi_mi300x.json").read_text()))


def test_mi300x_figures_match_the_data_sheet() -> None:
    spec = translate.device_specs(mi300x())[0]
    assert spec.id == "rocm:0"
    assert spec.device_class.value == "rocm"
    assert spec.memory_bytes == 192 * 2**30
    assert spec.memory_bandwidth_bytes_per_s == 5.3e12
    assert spec.peak_flops["fp16"] == pytest.approx(1307.4e12, rel=1e-3)
    assert spec.peak_flops["fp32"] == pytest.approx(163.4e12, rel=1e-3)
    assert spec.peak_flops["int8"] == pytest.approx(2614.9e12, rel=1e-3)


def test_mi300x_is_fully_connected_by_xgmi() -> None:
    specs = translate.device_specs(mi300x())
    for spec in specs:
        assert len(spec.links) == 7
        assert {link.kind for link in spec.links} == {LinkKind.XGMI}
        assert {link.bandwidth_bytes_per_s for link in spec.links} == {64e9}
    topology = Topology(specs)
    assert [hop.kind for hop in topology.route(1e9, "rocm:0", "rocm:7")] == ["xgmi"]


def test_a_pcie_pair_is_slower_and_routed_through_pcie() -> None:
    readings = mi300x()
    pairs = dict(readings.pairs)
    pairs[(0, 1)] = PairReading(link_type="pcie", hops=3)
    specs = translate.device_specs(
        AmdSmiReadings(readings.host, readings.driver_version, readings.gpus, pairs)
    )
    link = specs[0].link_to("rocm:1")
    assert link is not None and link.kind is LinkKind.PCIE
    assert link.bandwidth_bytes_per_s == pytest.approx(16 * 3.938e9 / 2)
    assert specs[0].properties["topology"]["rocm:1"] == "PCIE3"
