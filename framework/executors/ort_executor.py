"""ONNX Runtime sessions, pinned to one execution provider (CPU, CUDA, ROCm, CANN, ...)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["OrtExecutor", "available_providers"]

CPU_PROVIDER = "CPUExecutionProvider"


def available_providers() -> list[str]:
    """The execution providers this onnxruntime build offers."""
    import onnxruntime

    return list(onnxruntime.get_available_providers())


class OrtExecutor:
    """Sessions for one provider; ``provider_options`` go to the provider (``device_id``).

    A session never falls back to the CPU silently for nodes its provider cannot run, and never
    spin-waits: on a few shared cores spinning threads starve the other stages and the HTTP
    loop (measured: 20-60 % of throughput on 2 cores). Nor does it keep a memory arena: an
    arena grows to the largest batch it has seen and keeps it; without one, activations go
    back to the allocator (and to the OS after a large request: ``engine.heap``). Measured on
    a 256 x 8,000-character embeddings request: RSS +558 MB with the arena, +255 MB without it
    and with the trim.
    """

    def __init__(self, provider: str, provider_options: Mapping[str, Any] | None = None) -> None:
        import onnxruntime

        self._ort = onnxruntime
        self.provider = provider
        self.provider_options = dict(provider_options or {})
        self.version = str(onnxruntime.__version__)

    def session(self, source: bytes | str | Path, *, threads: int = 0) -> Any:
        """A session for the ONNX model at ``source`` (bytes or a path); ``threads`` intra-op
        threads (0: the runtime's default)."""
        options = self._ort.SessionOptions()
        options.log_severity_level = 3
        options.inter_op_num_threads = 1
        options.enable_cpu_mem_arena = False  # see the class doc
        if threads > 0:
            options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        if self.provider != CPU_PROVIDER:  # no silent CPU fallback for unsupported nodes
            options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        provider: Any = (
            (self.provider, self.provider_options) if self.provider_options else self.provider
        )
        model = source if isinstance(source, bytes) else str(source)
        session = self._ort.InferenceSession(model, options, providers=[provider])
        active = session.get_providers()
        if not active or active[0] != self.provider:
            raise RuntimeError(f"provider {self.provider} did not take the session (got {active})")
        return session

    @staticmethod
    def run(session: Any, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        """Run once; outputs by name, fresh arrays the caller owns."""
        names = [output.name for output in session.get_outputs()]
        feeds = {name: np.asarray(value, order="C") for name, value in inputs.items()}
        values = session.run(names, feeds)
        return {name: np.asarray(value) for name, value in zip(names, values, strict=True)}
