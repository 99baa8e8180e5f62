"""The ROCm backend: amdsmi telemetry and xGMI topology, torch HIP execution, HIP Graphs."""

from hetero.backends.rocm.detect import detect

__all__ = ["detect"]
