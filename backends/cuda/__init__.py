"""The CUDA backend (NVML telemetry, torch execution, CUDA Graph capture).

Only detection exists so far; execution arrives with the GPU backends issue.
"""

from hetero.backends.cuda.detect import detect

__all__ = ["detect"]
