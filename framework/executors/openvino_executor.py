"""OpenVINO: read ONNX, compile per device with a precision hint, run with pooled requests."""

from __future__ import annotations

import logging
import os
import queue
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["OpenVinoExecutor", "OpenVinoModel", "cpu_streams"]

logger = logging.getLogger(__name__)

# f32 unless the graph asks for reduced precision: OpenVINO defaults to bf16 on CPUs with
# AVX512-BF16, which changes numbers (and even Piper's output length).
PRECISION_BY_DTYPE = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}


class OpenVinoModel:
    """A compiled model with a pool of infer requests, so concurrent callers never share one
    (an infer request reuses its output tensors, and keeps its last inputs)."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self.input_names = frozenset(port.get_any_name() for port in compiled.inputs)
        self._idle: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        """Run once; outputs by name, copied out of the request's buffers."""
        # A missing input would silently reuse the previous request's data: names are checked.
        missing = sorted(self.input_names - inputs.keys())
        unknown = sorted(inputs.keys() - self.input_names)
        if missing or unknown:
            raise ValueError(f"inputs do not match the graph: missing {missing}, unknown {unknown}")
        try:
            request = self._idle.get_nowait()
        except queue.Empty:
            request = self.compiled.create_infer_request()
        try:
            results = request.infer(dict(inputs))
            return {port.get_any_name(): np.array(value) for port, value in results.items()}
        finally:
            self._idle.put(request)


class OpenVinoExecutor:
    """One ``openvino.Core`` for every device it reports (CPU here; GPU, NPU elsewhere).

    With ``cache_dir`` (a folder this process may write), OpenVINO keeps each compiled model
    there (its ``CACHE_DIR``, keyed by the model, the device, the config and its own version)
    and a later start imports it instead of compiling: the bench's embedder 173 -> 68 ms and
    its vision encoder 128-151 -> 48-51 ms on this CPU. A folder that cannot be made or written
    (a read-only file system) compiles every time, as without one."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        import openvino

        self._ov = openvino
        self.core = openvino.Core()
        self.version = str(openvino.__version__)
        self.cache_dir: Path | None = None
        if cache_dir is not None:
            try:
                cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as err:
                logger.info("openvino: no compiled-model cache at %s: %s", cache_dir, err)
                return
            if os.access(cache_dir, os.W_OK | os.X_OK):
                self.core.set_property({"CACHE_DIR": str(cache_dir)})
                self.cache_dir = cache_dir
            else:
                logger.info("openvino: no compiled-model cache at %s: not writable", cache_dir)

    def read(self, source: bytes | str | Path) -> Any:
        """Read and check an ONNX model without compiling it."""
        if isinstance(source, bytes):
            return self.core.read_model(source)
        return self.core.read_model(str(source))

    def compile(self, model: Any, device: str, *, dtype: str = "fp32", threads: int = 0) -> Any:
        """Compile for ``device``; on a CPU the precision follows ``dtype`` (f32 by default)
        and the model's threads are not pinned to cores.

        OpenVINO pins a CPU model's threads to cores of its choosing, per compiled model. A
        server runs several models side by side on the same cores (each stage's, and a copy
        with fewer threads while the cores are contended: ``engine.thread_budget``), and two
        one-thread models pinned to one core leave the other idle: an embedder and a vision
        encoder run side by side on the two-core bench machine finished 80 items a second
        pinned and 142 unpinned with one thread each, 97 and 116 with two (2026-12-06); one
        model at a time, alone, ran as fast either way (17.5 and 17.3 ms a request).

        With ``threads`` fewer than the cores, the model gets a stream per ``threads`` of
        them (:func:`cpu_streams`): a run takes ``threads`` threads, and as many runs as
        there are streams go side by side. One stream runs one request at a time, so
        callers of one compiled model queue behind each other: on the two-core bench machine
        two callers of a one-thread vision encoder ran 89-104 items a second between them
        (1.3 cores busy) and of the embedder 56-58 (1.1 cores), against 75 and 55 for one
        caller; with two one-thread streams, 143 and 110. A lane runs the parts of a batch
        side by side on such a copy (``engine.lanes``, core slots), as ONNX Runtime sessions
        run concurrent calls."""
        config: dict[str, Any] = {}
        if device.split(".", maxsplit=1)[0] == "CPU":
            config["INFERENCE_PRECISION_HINT"] = PRECISION_BY_DTYPE.get(dtype, "f32")
            config["ENABLE_CPU_PINNING"] = False
            if threads > 0:
                streams = cpu_streams(threads)
                config["NUM_STREAMS"] = streams
                config["INFERENCE_NUM_THREADS"] = threads * streams
        return OpenVinoModel(self.core.compile_model(model, device, config))


def cpu_streams(threads: int) -> int:
    """How many runs of ``threads`` threads each a CPU model runs side by side: as many as
    fit in the cores this process may use, at least one."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, threads))
