"""Reading a live host through NVML into :class:`NvmlReadings` (only where a driver exists)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from hetero.backends.cuda.readings import GpuReading, NvmlReadings

__all__ = ["read_gpu", "read_host"]

NVLINK_MAX_LINKS = 18


def _maybe(pynvml: Any, call: Callable[..., Any], *args: Any) -> Any:
    """The call's result, or None where NVML says the device does not support it."""
    try:
        return call(*args)
    except pynvml.NVMLError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_gpu(pynvml: Any, index: int) -> GpuReading:
    """Every reading of GPU ``index``; optional ones are None where unsupported."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    pci = pynvml.nvmlDeviceGetPciInfo(handle)
    utilisation = _maybe(pynvml, pynvml.nvmlDeviceGetUtilizationRates, handle)
    remotes: dict[int, str] = {}
    version = None
    for link in range(NVLINK_MAX_LINKS):
        state = _maybe(pynvml, pynvml.nvmlDeviceGetNvLinkState, handle, link)
        if state != pynvml.NVML_FEATURE_ENABLED:
            continue
        remote = _maybe(pynvml, pynvml.nvmlDeviceGetNvLinkRemotePciInfo_v2, handle, link)
        if remote is not None:
            remotes[link] = _text(remote.busId)
        version = version or _maybe(pynvml, pynvml.nvmlDeviceGetNvLinkVersion, handle, link)
    return GpuReading(
        index=index,
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        pci_bus_id=_text(pci.busId),
        memory_total_bytes=int(memory.total),
        memory_used_bytes=int(memory.used),
        compute_capability=tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),
        cuda_cores=_maybe(pynvml, pynvml.nvmlDeviceGetNumGpuCores, handle),
        max_sm_clock_mhz=int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)),
        memory_bus_width_bits=_maybe(pynvml, pynvml.nvmlDeviceGetMemoryBusWidth, handle),
        max_memory_clock_mhz=_maybe(
            pynvml, pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM
        ),
        pcie_generation=_maybe(pynvml, pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        pcie_width=_maybe(pynvml, pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
        utilisation_percent=None if utilisation is None else int(utilisation.gpu),
        power_milliwatts=_maybe(pynvml, pynvml.nvmlDeviceGetPowerUsage, handle),
        numa_node=_maybe(pynvml, pynvml.nvmlDeviceGetNumaNodeId, handle),
        nvlink_remote_bus_ids=remotes,
        nvlink_version=version,
    )


def read_host(pynvml: Any) -> NvmlReadings:
    """Readings of every GPU and every pair; NVML must be initialised by the caller."""
    count = int(pynvml.nvmlDeviceGetCount())
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    levels: dict[tuple[int, int], int] = {}
    p2p: set[tuple[int, int]] = set()
    for i in range(count):
        for j in range(count):
            if i == j:
                continue
            level = _maybe(
                pynvml, pynvml.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j]
            )
            if level is not None:
                levels[(i, j)] = int(level)
            status = _maybe(
                pynvml,
                pynvml.nvmlDeviceGetP2PStatus,
                handles[i],
                handles[j],
                pynvml.NVML_P2P_CAPS_INDEX_NVLINK,
            )
            if status == pynvml.NVML_P2P_STATUS_OK:
                p2p.add((i, j))
    return NvmlReadings(
        host=socket.gethostname(),
        driver_version=_text(pynvml.nvmlSystemGetDriverVersion()),
        gpus=tuple(read_gpu(pynvml, i) for i in range(count)),
        topology_levels=levels,
        nvlink_p2p=frozenset(p2p),
    )
