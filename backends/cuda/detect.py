"""Detection of NVIDIA devices through NVML, without touching a device at import time."""

from __future__ import annotations

from hetero.framework.registry import Detection

PRIORITY = 30


def probe_nvml() -> tuple[int, str]:
    """Number of NVIDIA devices and a reason; 0 devices means unavailable."""
    try:
        import pynvml
    except ImportError:
        return 0, "nvidia-ml-py is not installed (pip install 'hetero[cuda]')"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return 0, "NVML library not found"
    except pynvml.NVMLError as err:
        return 0, f"NVML failed to initialise: {err}"
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        driver = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        return 0, "NVML found no NVIDIA devices"
    return count, f"{count} device(s), driver {driver}"


def detect() -> Detection:
    """Unavailable here with the NVML reason; execution is not built yet even where NVML works."""
    count, reason = probe_nvml()
    if count == 0:
        return Detection.missing("cuda", reason)
    return Detection.missing("cuda", f"{reason}; the cuda execution backend is not built yet")
