"""From raw NVML readings to DeviceSpec, Telemetry and links: pure functions, no NVML.

Peak FLOP/s: SM count x max SM clock x FLOPs per cycle per SM, from a table keyed by compute
capability. The table's figures come from NVIDIA's architecture whitepapers (Volta GV100,
Turing TU102, Ampere GA100 and GA102, Ada AD102, Hopper GH100, Blackwell) and were checked
against the datasheets' dense peaks (A100 SXM: 108 SMs x 1.41 GHz x 2,048 = 312 TFLOPS fp16;
H100 SXM: 132 x 1.83 GHz x 4,096 = 989 TFLOPS; L4: 58 x 2.04 GHz x 1,024 = 121 TFLOPS).
Memory bandwidth: bus width x max memory clock x 2 (double data rate) / 8, which reproduces
the datasheets (A100 80GB: 5,120 bits x 1,593 MHz = 2,039 GB/s; L4: 192 bits x 6,251 MHz =
300 GB/s). PCIe: per-lane rates of each generation after line coding (PCI-SIG).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from hetero.backends.cuda.readings import TOPOLOGY_LEVELS, GpuReading, NvmlReadings
from hetero.framework.devices import DeviceClass, DeviceSpec, Link, LinkKind, Telemetry

__all__ = ["ArchFigures", "device_specs", "nvlink_peers", "peak_flops", "telemetry"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ArchFigures:
    """Per-SM throughput of one compute capability (FLOPs per cycle, dense)."""

    fp32_cores_per_sm: int
    fp16_tensor: int
    bf16_tensor: int
    int8_tensor: int

    @property
    def fp32(self) -> int:
        """One FMA per core per cycle: two FLOPs."""
        return 2 * self.fp32_cores_per_sm


ARCHITECTURES: dict[tuple[int, int], ArchFigures] = {
    (7, 0): ArchFigures(64, 1024, 0, 0),  # V100: no bf16, no int8 tensor cores
    (7, 5): ArchFigures(64, 1024, 0, 2048),  # T4
    (8, 0): ArchFigures(64, 2048, 2048, 4096),  # A100
    (8, 6): ArchFigures(128, 1024, 1024, 2048),  # A10, A40, RTX 30xx
    (8, 9): ArchFigures(128, 1024, 1024, 2048),  # L4, L40S, RTX 40xx
    (9, 0): ArchFigures(128, 4096, 4096, 8192),  # H100, H200
    (10, 0): ArchFigures(128, 8192, 8192, 16384),  # B200
}

# GB/s per lane, per direction, after 8b/10b (gen 1-2) or 128b/130b (gen 3-5) coding.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.877}
# NVLink bandwidth per link, per direction (NVLink 1: 20 GB/s; 2-4: 25; 5: 50).
NVLINK_LINK_BYTES_PER_S = {1: 20e9, 2: 25e9, 3: 25e9, 4: 25e9, 5: 50e9}
# A peer-to-peer PCIe path loses bandwidth and gains latency the further up the tree it goes.
# This is a model (NVIDIA's p2pBandwidthLatencyTest shows the trend), not a measurement.
PCIE_PATH = {10: (1.0, 1e-6), 20: (1.0, 1.5e-6), 30: (0.8, 2e-6), 40: (0.7, 3e-6), 50: (0.5, 5e-6)}


def _arch(gpu: GpuReading) -> ArchFigures:
    if gpu.compute_capability in ARCHITECTURES:
        return ARCHITECTURES[gpu.compute_capability]
    # An unknown minor version: use the highest known one of the same major version.
    same_major = [cc for cc in ARCHITECTURES if cc[0] == gpu.compute_capability[0]]
    known = max(same_major or ARCHITECTURES)
    return ARCHITECTURES[known]


def peak_flops(gpu: GpuReading) -> dict[str, float]:
    """Peak FLOP/s per dtype of ``gpu``."""
    arch = _arch(gpu)
    if not gpu.cuda_cores:
        logger.warning(
            "%s: NVML did not report CUDA cores; peak FLOP/s is a floor until the policy "
            "overrides it",
            gpu.name,
        )
    sms = (gpu.cuda_cores or 0) // arch.fp32_cores_per_sm or 1
    cycles = sms * gpu.max_sm_clock_mhz * 1e6
    flops = {"fp32": cycles * arch.fp32, "fp16": cycles * max(arch.fp16_tensor, arch.fp32)}
    flops["bf16"] = cycles * arch.bf16_tensor if arch.bf16_tensor else flops["fp32"]
    flops["int8"] = cycles * arch.int8_tensor if arch.int8_tensor else flops["fp32"] * 4
    return flops


def memory_bandwidth(gpu: GpuReading) -> float:
    """Peak memory bandwidth in bytes/s, from bus width and memory clock."""
    if gpu.memory_bus_width_bits and gpu.max_memory_clock_mhz:
        return gpu.memory_bus_width_bits / 8 * gpu.max_memory_clock_mhz * 1e6 * 2
    return 100e9  # NVML could not say: a conservative floor, overridable in the policy


def pcie_bandwidth(gpu: GpuReading) -> float:
    """Host link bandwidth per direction in bytes/s (Gen3 x16 when NVML cannot say)."""
    generation = gpu.pcie_generation or 3
    width = gpu.pcie_width or 16
    return PCIE_LANE_GBPS.get(generation, PCIE_LANE_GBPS[3]) * width * 1e9


def nvlink_peers(readings: NvmlReadings) -> dict[tuple[int, int], int]:
    """Active NVLink links between GPU pairs.

    Links whose remote end is another GPU are counted per peer. Links that end at an NVSwitch
    (the remote bus id is no GPU's) carry traffic to every GPU NVML reports NVLink P2P with,
    so each such peer gets all of them, as `nvidia-smi topo -m` shows NV12 on a DGX A100.
    """
    by_bus = {gpu.pci_bus_id.lower(): gpu.index for gpu in readings.gpus}
    counts: dict[tuple[int, int], int] = {}
    for gpu in readings.gpus:
        direct: Counter[int] = Counter()
        switched = 0
        for remote in gpu.nvlink_remote_bus_ids.values():
            peer = by_bus.get(remote.lower())
            if peer is None:
                switched += 1
            elif peer != gpu.index:
                direct[peer] += 1
        for peer, links in direct.items():
            counts[(gpu.index, peer)] = links
        if switched:
            for other in readings.gpus:
                pair = (gpu.index, other.index)
                if other.index != gpu.index and pair in readings.nvlink_p2p:
                    counts[pair] = max(counts.get(pair, 0), switched)
    return counts


def device_specs(readings: NvmlReadings, backend: str = "cuda") -> list[DeviceSpec]:
    """DeviceSpecs for every GPU, with NVLink or PCIe links to every other GPU."""
    nvlinks = nvlink_peers(readings)
    specs = []
    for gpu in readings.gpus:
        links = []
        topology = {}
        for other in readings.gpus:
            if other.index == gpu.index:
                continue
            peer_id = f"{backend}:{other.index}"
            count = nvlinks.get((gpu.index, other.index), 0)
            if count:
                per_link = NVLINK_LINK_BYTES_PER_S.get(gpu.nvlink_version or 3, 25e9)
                links.append(Link(peer_id, LinkKind.NVLINK, count * per_link, 1e-6))
                topology[peer_id] = f"NV{count}"
                continue
            level = readings.topology_levels.get((gpu.index, other.index), 50)
            share, latency = PCIE_PATH.get(level, PCIE_PATH[50])
            bandwidth = min(pcie_bandwidth(gpu), pcie_bandwidth(other)) * share
            links.append(Link(peer_id, LinkKind.PCIE, bandwidth, latency))
            topology[peer_id] = TOPOLOGY_LEVELS.get(level, "SYS")
        major, minor = gpu.compute_capability
        specs.append(
            DeviceSpec(
                id=f"{backend}:{gpu.index}",
                device_class=DeviceClass.CUDA,
                vendor_name=gpu.name,
                backend=backend,
                host=readings.host,
                memory_bytes=gpu.memory_total_bytes,
                peak_flops=peak_flops(gpu),
                memory_bandwidth_bytes_per_s=memory_bandwidth(gpu),
                links=tuple(links),
                numa_node=gpu.numa_node,
                properties={
                    "uuid": gpu.uuid,
                    "pci_bus_id": gpu.pci_bus_id,
                    "compute_capability": f"{major}.{minor}",
                    "driver_version": readings.driver_version,
                    "pcie": f"Gen{gpu.pcie_generation} x{gpu.pcie_width}",
                    "host_bandwidth_bytes_per_s": pcie_bandwidth(gpu),
                    "topology": topology,
                },
            )
        )
    return specs


def telemetry(gpu: GpuReading, device_id: str, taken_at: float) -> Telemetry:
    """Telemetry from one GPU's readings."""
    return Telemetry(
        device_id=device_id,
        memory_used_bytes=gpu.memory_used_bytes,
        utilisation=min(1.0, (gpu.utilisation_percent or 0) / 100.0),
        power_watts=gpu.power_milliwatts / 1000.0 if gpu.power_milliwatts is not None else None,
        taken_at=taken_at,
    )
