"""FakeNvml: replays recorded NvmlReadings through pynvml's API, for hosts without a GPU.

A fake stands in only for hardware absent here; the real path (pynvml against a driver) is
``hetero.backends.cuda.nvml_probe`` and runs on GPU hosts (``benchmarks/gpu_check.sh``).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hetero.backends.cuda.readings import NvmlReadings

READINGS = Path(__file__).parents[1] / "unit" / "readings"


def recorded(name: str) -> NvmlReadings:
    """Recorded readings from tests/unit/readings/<name>.json."""
    return NvmlReadings.from_json(json.loads((READINGS / f"{name}.json").read_text()))


class NVMLError(Exception):
    """pynvml.NVMLError's stand-in."""


class NVMLError_NotSupported(NVMLError):  # noqa: N801, N818 - pynvml's spelling
    """The device does not support the query."""


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801, N818 - pynvml's spelling
    """The GPU fell off the bus."""


class FakeNvml:
    """The subset of pynvml that nvml_probe calls, answering from recorded readings."""

    NVMLError = NVMLError
    NVML_FEATURE_ENABLED = 1
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_P2P_CAPS_INDEX_NVLINK = 4
    NVML_P2P_STATUS_OK = 0

    def __init__(self, readings: NvmlReadings) -> None:
        self.readings = readings
        self.lost: set[int] = set()
        self.initialised = 0

    def _gpu(self, handle: int) -> Any:
        if handle in self.lost:
            raise NVMLError_GpuIsLost("GPU is lost")
        return self.readings.gpus[handle]

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's spelling
        self.initialised += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.readings.gpus)

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self.readings.driver_version

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:  # noqa: N802
        gpu = self._gpu(handle)
        return SimpleNamespace(total=gpu.memory_total_bytes, used=gpu.memory_used_bytes)

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(busId=self._gpu(handle).pci_bus_id.encode())

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(gpu=self._gpu(handle).utilisation_percent)

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:  # noqa: N802
        if link not in self._gpu(handle).nvlink_remote_bus_ids:
            raise NVMLError_NotSupported(link)
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: int, link: int) -> Any:  # noqa: N802
        return SimpleNamespace(busId=self._gpu(handle).nvlink_remote_bus_ids[link])

    def nvmlDeviceGetNvLinkVersion(self, handle: int, link: int) -> int | None:  # noqa: N802
        return self._gpu(handle).nvlink_version

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802
        return self._gpu(handle).uuid

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:  # noqa: N802
        return self._gpu(handle).compute_capability  # type: ignore[no-any-return]

    def nvmlDeviceGetNumGpuCores(self, handle: int) -> int:  # noqa: N802
        return self._gpu(handle).cuda_cores  # type: ignore[no-any-return]

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock: int) -> int:  # noqa: N802
        gpu = self._gpu(handle)
        return gpu.max_sm_clock_mhz if clock == self.NVML_CLOCK_SM else gpu.max_memory_clock_mhz  # type: ignore[no-any-return]

    def nvmlDeviceGetMemoryBusWidth(self, handle: int) -> int:  # noqa: N802
        return self._gpu(handle).memory_bus_width_bits  # type: ignore[no-any-return]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:  # noqa: N802
        return self._gpu(handle).pcie_generation  # type: ignore[no-any-return]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:  # noqa: N802
        return self._gpu(handle).pcie_width  # type: ignore[no-any-return]

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:  # noqa: N802
        return self._gpu(handle).power_milliwatts  # type: ignore[no-any-return]

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:  # noqa: N802
        return self._gpu(handle).numa_node  # type: ignore[no-any-return]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:  # noqa: N802
        return self.readings.topology_levels[(a, b)]

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, caps: int) -> int:  # noqa: N802
        return self.NVML_P2P_STATUS_OK if (a, b) in self.readings.nvlink_p2p else 3
