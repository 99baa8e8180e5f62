"""The ROCm backend (amdsmi telemetry, torch HIP execution, HIP Graph capture).

Only detection exists so far; execution arrives with the GPU backends issue.
"""

from hetero.backends.rocm.detect import detect

__all__ = ["detect"]
