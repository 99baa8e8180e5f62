"""NVML readings to DeviceSpec, telemetry and topology: recorded machines, no GPU needed."""

from __future__ import annotations

import pytest
from fake_nvml import recorded

from hetero.backends.cuda import translate
from hetero.framework.devices import LinkKind
from hetero.framework.topology import Topology


@pytest.fixture(scope="module")
def dgx() -> list:  # type: ignore[type-arg]
    return translate.device_specs(recorded("nvml_dgx_a100"))


def test_dgx_a100_figures_match_the_datasheet(dgx: list) -> None:  # type: ignore[type-arg]
    a100 = dgx[0]
    assert a100.id == "cuda:0"
    assert a100.memory_bytes == 80 * 2**30
    assert a100.memory_bandwidth_bytes_per_s == pytest.approx(2039e9, rel=1e-3)
    assert a100.peak_flops["fp32"] == pytest.approx(19.5e12, rel=1e-3)
    assert a100.peak_flops["fp16"] == pytest.approx(312e12, rel=1e-3)
    assert a100.peak_flops["int8"] == pytest.approx(624e12, rel=1e-3)
    assert a100.properties["compute_capability"] == "8.0"
    assert a100.numa_node == 3


def test_dgx_a100_nvswitch_gives_nv12_between_every_pair(dgx: list) -> None:  # type: ignore[type-arg]
    for spec in dgx:
        assert len(spec.links) == 7
        assert all(link.kind is LinkKind.NVLINK for link in spec.links)
        assert all(link.bandwidth_bytes_per_s == 300e9 for link in spec.links)
        assert set(spec.properties["topology"].values()) == {"NV12"}


def test_pcie_only_server_follows_the_pcie_tree() -> None:
    specs = translate.device_specs(recorded("nvml_pcie_4xl4"))
    l4 = specs[0]
    assert l4.memory_bandwidth_bytes_per_s == pytest.approx(300e9, rel=1e-2)
    assert l4.peak_flops["fp16"] == pytest.approx(121e12, rel=0.02)
    same_switch = l4.link_to("cuda:1")
    other_socket = l4.link_to("cuda:2")
    assert same_switch is not None and other_socket is not None
    assert same_switch.kind is other_socket.kind is LinkKind.PCIE
    assert same_switch.bandwidth_bytes_per_s == pytest.approx(16 * 1.969e9)
    assert other_socket.bandwidth_bytes_per_s == pytest.approx(0.5 * 16 * 1.969e9)
    assert l4.properties["topology"] == {"cuda:1": "PXB", "cuda:2": "SYS", "cuda:3": "SYS"}


def test_direct_gpu_to_gpu_nvlinks_are_counted_per_peer() -> None:
    readings = recorded("nvml_pcie_4xl4")
    gpus = list(readings.gpus)
    bus = {g.index: g.pci_bus_id for g in gpus}
    # An NVLink bridge between GPUs 0 and 1 (4 links), as on a pair of A10/A40 cards.
    gpus[0] = type(gpus[0])(
        **{
            **_fields(gpus[0]),
            "nvlink_remote_bus_ids": {i: bus[1] for i in range(4)},
            "nvlink_version": 3,
        }
    )
    gpus[1] = type(gpus[1])(
        **{
            **_fields(gpus[1]),
            "nvlink_remote_bus_ids": {i: bus[0] for i in range(4)},
            "nvlink_version": 3,
        }
    )
    bridged = type(readings)(
        readings.host,
        readings.driver_version,
        tuple(gpus),
        readings.topology_levels,
        readings.nvlink_p2p,
    )
    assert translate.nvlink_peers(bridged) == {(0, 1): 4, (1, 0): 4}
    spec = translate.device_specs(bridged)[0]
    link = spec.link_to("cuda:1")
    assert link is not None and link.kind is LinkKind.NVLINK and link.bandwidth_bytes_per_s == 100e9


def test_topology_prefers_nvlink_and_crosses_hosts_by_network(dgx: list) -> None:  # type: ignore[type-arg]
    l4s = translate.device_specs(recorded("nvml_pcie_4xl4"), backend="cuda2")
    topology = Topology([*dgx, *l4s])
    size = 1e9
    nvlink = topology.transfer_time(size, "cuda:0", "cuda:5")
    assert nvlink == pytest.approx(1e-6 + size / 300e9)
    cross = topology.route(size, "cuda:0", "cuda2:0")
    assert [hop.kind for hop in cross] == ["host", "network", "host"]
    assert topology.transfer_time(size, "cuda:0", "cuda2:0") > nvlink
    assert topology.transfer_time(size, "cuda:3", "cuda:3") == 0.0


def test_telemetry_from_readings() -> None:
    gpu = recorded("nvml_dgx_a100").gpus[3]
    sample = translate.telemetry(gpu, "cuda:3", taken_at=12.0)
    assert sample.utilisation == pytest.approx(0.3)
    assert sample.power_watts == pytest.approx(63.0)
    assert sample.memory_used_bytes == 16 * 2**20


def _fields(obj: object) -> dict:  # type: ignore[type-arg]
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}  # type: ignore[attr-defined]
