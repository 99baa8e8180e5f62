"""Detection of NVIDIA devices through NVML, without touching a device at import time."""

from __future__ import annotations

from importlib.util import find_spec

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
    driver_text = driver.decode() if isinstance(driver, bytes) else str(driver)
    return count, f"{count} device(s), driver {driver_text}"


def detect() -> Detection:
    """Available where NVML sees a GPU and torch is installed; otherwise the reason why not."""
    count, reason = probe_nvml()
    if count == 0:
        return Detection.missing("cuda", reason)
    if find_spec("torch") is None:
        return Detection.missing("cuda", f"{reason}, but torch is not installed")
    from hetero.backends.cuda.backend import CudaBackend

    return Detection.found("cuda", CudaBackend, reason=reason, priority=PRIORITY)
