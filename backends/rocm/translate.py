"""From raw amdsmi readings to DeviceSpec, Telemetry and xGMI/PCIe links: pure functions.

Peak FLOP/s: compute units x max engine clock x FLOPs per CU per cycle, keyed by the gfx
target; figures from AMD's CDNA 3, CDNA 2 and CDNA and RDNA 3 whitepapers, checked against the
data sheets' dense peaks (MI300X: 304 CUs x 2.1 GHz x 2,048 = 1,307.4 TFLOPS fp16; MI250X per
GCD: 110 x 1.7 GHz x 1,024 = 191.5). Memory bandwidth per gfx target from the same data sheets
(amdsmi reports no bus width on every release). xGMI: amdsmi's max io-link bandwidth where it
reports one, else 64 GB/s per direction per link (MI300X: 128 GB/s bidirectional per link).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hetero.backends.rocm.readings import AmdGpuReading, AmdSmiReadings
from hetero.framework.devices import DeviceClass, DeviceSpec, Link, LinkKind, Telemetry

__all__ = ["device_specs", "peak_flops", "telemetry"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CdnaFigures:
    """FLOPs per CU per cycle (dense matrix units) and memory bandwidth of one gfx target."""

    fp32: int
    fp16: int
    bf16: int
    int8: int
    memory_bandwidth: float


GFX_TARGETS = {
    "gfx942": CdnaFigures(256, 2048, 2048, 4096, 5.3e12),  # MI300X / MI300A / MI325X
    "gfx90a": CdnaFigures(256, 1024, 1024, 1024, 1.6e12),  # MI210 / MI250X (per GCD)
    "gfx908": CdnaFigures(256, 1024, 512, 1024, 1.2288e12),  # MI100
    "gfx1100": CdnaFigures(256, 512, 512, 512, 0.96e12),  # W7900 / RX 7900 XTX
}
XGMI_LINK_BYTES_PER_S = 64e9
PCIE_LANE_GBPS = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.877}


def _figures(gpu: AmdGpuReading) -> CdnaFigures:
    figures = GFX_TARGETS.get(gpu.gfx_target.split(":")[0])
    if figures is None:
        logger.warning(
            "%s: unknown gfx target %r; using gfx90a figures until the policy overrides them",
            gpu.name,
            gpu.gfx_target,
        )
        return GFX_TARGETS["gfx90a"]
    return figures


def peak_flops(gpu: AmdGpuReading) -> dict[str, float]:
    """Peak FLOP/s per dtype."""
    figures = _figures(gpu)
    cycles = gpu.compute_units * gpu.max_sclk_mhz * 1e6
    return {
        "fp32": cycles * figures.fp32,
        "fp16": cycles * figures.fp16,
        "bf16": cycles * figures.bf16,
        "int8": cycles * figures.int8,
    }


def pcie_bandwidth(gpu: AmdGpuReading) -> float:
    """Host link bandwidth per direction (Gen4 x16 when amdsmi cannot say)."""
    return (
        PCIE_LANE_GBPS.get(gpu.pcie_generation or 4, PCIE_LANE_GBPS[4])
        * (gpu.pcie_width or 16)
        * 1e9
    )


def device_specs(readings: AmdSmiReadings, backend: str = "rocm") -> list[DeviceSpec]:
    """DeviceSpecs with xGMI (or PCIe) links to every other GPU."""
    specs = []
    for gpu in readings.gpus:
        links = []
        topology = {}
        for other in readings.gpus:
            if other.index == gpu.index:
                continue
            peer_id = f"{backend}:{other.index}"
            pair = readings.pairs.get((gpu.index, other.index))
            if pair is not None and pair.link_type == "xgmi":
                bandwidth = (
                    pair.max_bandwidth_mb_per_s * 1e6
                    if pair.max_bandwidth_mb_per_s
                    else XGMI_LINK_BYTES_PER_S
                )
                links.append(Link(peer_id, LinkKind.XGMI, bandwidth, 1e-6 * max(pair.hops, 1)))
                topology[peer_id] = f"XGMI{pair.hops}"
            else:
                hops = pair.hops if pair is not None else 3
                bandwidth = min(pcie_bandwidth(gpu), pcie_bandwidth(other)) / max(1, hops - 1)
                links.append(Link(peer_id, LinkKind.PCIE, bandwidth, 2e-6 * max(hops, 1)))
                topology[peer_id] = f"PCIE{hops}"
        specs.append(
            DeviceSpec(
                id=f"{backend}:{gpu.index}",
                device_class=DeviceClass.ROCM,
                vendor_name=gpu.name,
                backend=backend,
                host=readings.host,
                memory_bytes=gpu.vram_total_bytes,
                peak_flops=peak_flops(gpu),
                memory_bandwidth_bytes_per_s=_figures(gpu).memory_bandwidth,
                links=tuple(links),
                numa_node=gpu.numa_node,
                properties={
                    "uuid": gpu.uuid,
                    "bdf": gpu.bdf,
                    "gfx_target": gpu.gfx_target,
                    "driver_version": readings.driver_version,
                    "pcie": f"Gen{gpu.pcie_generation} x{gpu.pcie_width}",
                    "host_bandwidth_bytes_per_s": pcie_bandwidth(gpu),
                    "topology": topology,
                },
            )
        )
    return specs


def telemetry(gpu: AmdGpuReading, device_id: str, taken_at: float) -> Telemetry:
    """Telemetry from one GPU's readings."""
    return Telemetry(
        device_id=device_id,
        memory_used_bytes=gpu.vram_used_bytes,
        utilisation=min(1.0, (gpu.gfx_activity_percent or 0) / 100.0),
        power_watts=gpu.power_watts,
        taken_at=taken_at,
    )
