"""One ``run(feeds) -> outputs`` interface over ONNX Runtime and OpenVINO CPU.

OpenVINO is compiled with ``INFERENCE_PRECISION_HINT=f32``: its CPU plugin otherwise runs in
bf16 on CPUs that have it, and outputs then differ from ONNX Runtime by up to ~1 in logits.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["OnnxSession", "open_onnx"]


class OnnxSession:
    """An ONNX model compiled for one runtime; outputs come back in the model's order.

    Attributes:
        path: The .onnx file.
        runtime: ``onnxruntime`` or ``openvino``.
        input_names: Input names in the model's order.
    """

    def __init__(self, path: Path, runtime: str, threads: int = 1) -> None:
        self.path = Path(path)
        self.runtime = runtime
        self._lock = threading.Lock()
        if runtime == "onnxruntime":
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            # No spin-waiting: on a few shared cores spinning threads starve the other stages
            # and the HTTP loop (measured: 20-60 % of throughput on 2 cores).
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.add_session_config_entry("session.inter_op.allow_spinning", "0")
            self._ort = ort.InferenceSession(
                str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
            )
            self.input_names = tuple(i.name for i in self._ort.get_inputs())
        elif runtime == "openvino":
            config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads}
            self._compiled = _openvino_core().compile_model(str(self.path), "CPU", config)
            self._request = self._compiled.create_infer_request()
            self.input_names = tuple(i.get_any_name() for i in self._compiled.inputs)
        else:
            raise ValueError(f"no ONNX session for runtime {runtime!r}")

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run once; every output is a fresh array the caller owns."""
        if self.runtime == "onnxruntime":
            return [np.asarray(o) for o in self._ort.run(None, dict(feeds))]
        with self._lock:  # one infer request: its output tensors are reused per call
            result = self._request.infer(dict(feeds))
            return [np.array(result[o], copy=True) for o in self._compiled.outputs]

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Positional form of :meth:`run`, inputs in the model's order."""
        return self.run(dict(zip(self.input_names, inputs, strict=True)))


@functools.cache
def _openvino_core() -> Any:
    import openvino as ov

    return ov.Core()


def open_onnx(path: Path, runtime: str, threads: int = 1) -> OnnxSession:
    """Compile ``path`` for ``runtime`` (``onnxruntime`` or ``openvino``) on the CPU."""
    return OnnxSession(path, runtime, threads)
