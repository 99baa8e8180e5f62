"""Reading a live host through amdsmi into :class:`AmdSmiReadings` (only where ROCm exists).

Calls follow the amdsmi Python API of ROCm 6.x; every optional reading tolerates
``AmdSmiException`` (an unsupported query on that GPU) and becomes None.
"""

from __future__ import annotations

import contextlib
import io
import socket
from collections.abc import Callable
from typing import Any

from hetero.backends.rocm.readings import AmdGpuReading, AmdSmiReadings, PairReading

__all__ = ["import_amdsmi", "read_gpu", "read_host"]


def import_amdsmi() -> Any:
    """``import amdsmi``, with the two lines it prints to stdout where ROCm is absent
    swallowed (it then raises ``KeyError``, not an ImportError)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import amdsmi
    return amdsmi


def _maybe(amdsmi: Any, call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except amdsmi.AmdSmiException:
        return None


def _pcie(amdsmi: Any, handle: Any) -> tuple[int | None, int | None]:
    info = _maybe(amdsmi, amdsmi.amdsmi_get_pcie_info, handle) or {}
    static = info.get("pcie_static", {})
    return static.get("pcie_interface_version"), static.get("max_pcie_width")


def read_gpu(amdsmi: Any, handles: list[Any], index: int) -> AmdGpuReading:
    """Every reading of GPU ``index``."""
    handle = handles[index]
    asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
    vram = amdsmi.AmdSmiMemoryType.VRAM
    clock = _maybe(amdsmi, amdsmi.amdsmi_get_clock_info, handle, amdsmi.AmdSmiClkType.SYS) or {}
    activity = _maybe(amdsmi, amdsmi.amdsmi_get_gpu_activity, handle) or {}
    power = _maybe(amdsmi, amdsmi.amdsmi_get_power_info, handle) or {}
    generation, width = _pcie(amdsmi, handle)
    watts = power.get("current_socket_power") or power.get("average_socket_power")
    return AmdGpuReading(
        index=index,
        name=str(asic.get("market_name", "AMD GPU")),
        bdf=str(amdsmi.amdsmi_get_gpu_device_bdf(handle)),
        uuid=str(_maybe(amdsmi, amdsmi.amdsmi_get_gpu_device_uuid, handle) or ""),
        gfx_target=str(asic.get("target_graphics_version", "unknown")),
        compute_units=int(asic.get("num_of_compute_units", 0)),
        max_sclk_mhz=int(clock.get("max_clk", 0)),
        vram_total_bytes=int(amdsmi.amdsmi_get_gpu_memory_total(handle, vram)),
        vram_used_bytes=int(amdsmi.amdsmi_get_gpu_memory_usage(handle, vram)),
        pcie_generation=generation,
        pcie_width=width,
        gfx_activity_percent=activity.get("gfx_activity"),
        power_watts=float(watts) if isinstance(watts, int | float) else None,
        numa_node=_maybe(amdsmi, amdsmi.amdsmi_topo_get_numa_node_number, handle),
    )


def read_host(amdsmi: Any) -> AmdSmiReadings:
    """Readings of every GPU and pair; amdsmi must be initialised by the caller."""
    handles = list(amdsmi.amdsmi_get_processor_handles())
    xgmi = amdsmi.AmdSmiIoLinkType.XGMI
    pairs: dict[tuple[int, int], PairReading] = {}
    for i, src in enumerate(handles):
        for j, dst in enumerate(handles):
            if i == j:
                continue
            link = _maybe(amdsmi, amdsmi.amdsmi_topo_get_link_type, src, dst)
            if link is None:
                continue
            bandwidth = _maybe(
                amdsmi, amdsmi.amdsmi_get_minmax_bandwidth_between_processors, src, dst
            )
            pairs[(i, j)] = PairReading(
                link_type="xgmi" if link.get("type") == xgmi else "pcie",
                hops=int(link.get("hops", 1)),
                max_bandwidth_mb_per_s=(bandwidth or {}).get("max_bandwidth") or None,
            )
    version = _maybe(amdsmi, amdsmi.amdsmi_get_lib_version) or {}
    return AmdSmiReadings(
        host=socket.gethostname(),
        driver_version=str(version.get("build", version) if isinstance(version, dict) else version),
        gpus=tuple(read_gpu(amdsmi, handles, i) for i in range(len(handles))),
        pairs=pairs,
    )
