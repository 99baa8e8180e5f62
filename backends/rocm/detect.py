"""Detection of AMD GPUs through amdsmi.

Without ROCm, ``import amdsmi`` prints two lines to stdout and raises ``KeyError`` (not an
ImportError); detection swallows that output and reports ``amdsmi library not found``.
"""

from __future__ import annotations

from importlib.util import find_spec

from hetero.backends.rocm.amdsmi_probe import import_amdsmi
from hetero.framework.registry import Detection

PRIORITY = 30


def probe_amdsmi() -> tuple[int, str]:
    """Number of AMD GPUs and a reason; 0 devices means unavailable."""
    try:
        amdsmi = import_amdsmi()
    except ImportError:
        return 0, "amdsmi is not installed (pip install 'hetero[rocm]')"
    except Exception:  # KeyError('libamd_smi.so') when ROCm's library is absent
        return 0, "amdsmi library not found"
    try:
        amdsmi.amdsmi_init()
    except Exception as err:
        return 0, f"amdsmi failed to initialise: {err}"
    try:
        count = len(amdsmi.amdsmi_get_processor_handles())
    finally:
        amdsmi.amdsmi_shut_down()
    if count == 0:
        return 0, "amdsmi found no AMD GPUs"
    return count, f"{count} device(s)"


def detect() -> Detection:
    """Available where amdsmi sees a GPU and torch is installed; otherwise the reason why not."""
    count, reason = probe_amdsmi()
    if count == 0:
        return Detection.missing("rocm", reason)
    if find_spec("torch") is None:
        return Detection.missing("rocm", f"{reason}, but torch is not installed")
    from hetero.backends.rocm.backend import RocmBackend

    return Detection.found("rocm", RocmBackend, reason=reason, priority=PRIORITY)
