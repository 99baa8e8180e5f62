"""Raw amdsmi readings as plain data, replayable in tests (see :mod:`translate`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AmdGpuReading", "AmdSmiReadings", "PairReading"]


@dataclass(frozen=True, slots=True)
class AmdGpuReading:
    """One AMD GPU as amdsmi reports it; optional readings are None where unsupported."""

    index: int
    name: str
    bdf: str
    uuid: str
    gfx_target: str
    compute_units: int
    max_sclk_mhz: int
    vram_total_bytes: int
    vram_used_bytes: int
    pcie_generation: int | None = None
    pcie_width: int | None = None
    gfx_activity_percent: int | None = None
    power_watts: float | None = None
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class PairReading:
    """``amdsmi_topo_get_link_type`` and the io-link bandwidth between two GPUs."""

    link_type: str  # "xgmi" or "pcie"
    hops: int
    max_bandwidth_mb_per_s: int | None = None


@dataclass(frozen=True, slots=True)
class AmdSmiReadings:
    """A whole host."""

    host: str
    driver_version: str
    gpus: tuple[AmdGpuReading, ...]
    pairs: dict[tuple[int, int], PairReading] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AmdSmiReadings:
        """Rebuild readings from their JSON form (as recorded in tests)."""
        pairs = {
            (int(i), int(j)): PairReading(**pair)
            for key, pair in data.get("pairs", {}).items()
            for i, j in [key.split(",")]
        }
        return cls(
            host=data["host"],
            driver_version=data["driver_version"],
            gpus=tuple(AmdGpuReading(**gpu) for gpu in data["gpus"]),
            pairs=pairs,
        )
