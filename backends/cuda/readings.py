"""Raw NVML readings, as plain data: what :mod:`nvml_probe` reads and :mod:`translate` turns
into DeviceSpecs, Telemetry and links. Keeping them plain lets tests replay recorded machines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["GpuReading", "NvmlReadings"]

# NVML's nvmlGpuTopologyLevel_t, and the names `nvidia-smi topo -m` prints for them.
TOPOLOGY_LEVELS = {0: "SELF", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU as NVML reports it. Optional readings are None where NVML says NotSupported."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_bytes: int
    memory_used_bytes: int
    compute_capability: tuple[int, int]
    cuda_cores: int | None
    max_sm_clock_mhz: int
    memory_bus_width_bits: int | None
    max_memory_clock_mhz: int | None
    pcie_generation: int | None
    pcie_width: int | None
    utilisation_percent: int | None = None
    power_milliwatts: int | None = None
    numa_node: int | None = None
    # NVLink: link index -> remote PCI bus id (a GPU's, or an NVSwitch's) of active links.
    nvlink_remote_bus_ids: dict[int, str] = field(default_factory=dict)
    nvlink_version: int | None = None


@dataclass(frozen=True, slots=True)
class NvmlReadings:
    """A whole host: its GPUs and the pairwise facts NVML gives."""

    host: str
    driver_version: str
    gpus: tuple[GpuReading, ...]
    # (i, j) -> nvmlDeviceGetTopologyCommonAncestor level, for i != j.
    topology_levels: dict[tuple[int, int], int] = field(default_factory=dict)
    # (i, j) pairs where nvmlDeviceGetP2PStatus(..., NVML_P2P_CAPS_INDEX_NVLINK) is OK.
    nvlink_p2p: frozenset[tuple[int, int]] = frozenset()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NvmlReadings:
        """Rebuild readings from their JSON form (as recorded in tests)."""
        gpus = tuple(
            GpuReading(
                **{
                    **gpu,
                    "compute_capability": tuple(gpu["compute_capability"]),
                    "nvlink_remote_bus_ids": {
                        int(k): v for k, v in gpu.get("nvlink_remote_bus_ids", {}).items()
                    },
                }
            )
            for gpu in data["gpus"]
        )
        levels = {
            (int(i), int(j)): int(level)
            for key, level in data.get("topology_levels", {}).items()
            for i, j in [key.split(",")]
        }
        p2p = frozenset((int(i), int(j)) for i, j in data.get("nvlink_p2p", []))
        return cls(
            host=data["host"],
            driver_version=data["driver_version"],
            gpus=gpus,
            topology_levels=levels,
            nvlink_p2p=p2p,
        )
