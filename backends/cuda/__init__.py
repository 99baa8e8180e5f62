"""The CUDA backend: NVML telemetry and topology, torch execution, CUDA Graph capture."""

from hetero.backends.cuda.detect import detect

__all__ = ["detect"]
