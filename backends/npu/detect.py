"""Cheap detection of the npu backend: is OpenVINO, ONNX Runtime or torch importable?"""

from __future__ import annotations

from importlib.util import find_spec

from hetero.framework.registry import Detection

RUNTIMES = ("openvino", "onnxruntime", "torch")
PRIORITY = 10


def _installed(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def detect() -> Detection:
    """Available when at least one runtime is installed; imports none of them."""
    present = [name for name in RUNTIMES if _installed(name)]
    if not present:
        return Detection.missing("npu", "none of openvino, onnxruntime, torch is installed")

    def factory() -> NpuBackend:
        return NpuBackend(runtimes=tuple(present))

    from hetero.backends.npu.backend import NpuBackend

    return Detection.found(
        "npu", factory, reason="runtimes: " + ", ".join(present), priority=PRIORITY
    )
