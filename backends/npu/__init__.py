"""The CPU/NPU backend: OpenVINO (CPU, GPU, NPU devices) and ONNX Runtime (CPU, CANN, ...).

Both runtimes read ONNX directly. The backend is named ``npu``; its device ids are
``npu:openvino/<DEVICE>`` and ``npu:onnxruntime/<ExecutionProvider>``.
"""

from hetero.backends.npu.backend import NpuBackend
from hetero.backends.npu.detect import detect

__all__ = ["NpuBackend", "detect"]
