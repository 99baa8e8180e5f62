"""The contract every model stage follows: prepare artefacts, load sessions, describe a graph.

A stage is built cheaply (no imports of torch or a runtime, no file access); :meth:`prepare`
writes derived artefacts (an exported ONNX file, a converted state dict) into the model cache
once; :meth:`load` opens the sessions. Inference methods load on first use, so a caller may skip
both. Each stage exposes the network the cost model should see through :meth:`graph`.
"""

from __future__ import annotations

import abc
import threading
from pathlib import Path
from typing import ClassVar

from hetero.framework.graph import ComputeGraph
from hetero.models.assets import model_cache_dir, offline_hub

__all__ = ["RUNTIMES", "VARIANTS", "ModelStage"]

RUNTIMES = ("onnxruntime", "openvino", "torch")
VARIANTS = ("full", "light")


class ModelStage(abc.ABC):
    """A real model behind one policy stage.

    Attributes:
        name: The policy stage name (``vision_encode``, ``asr``...).
        runtimes: The runtimes this stage can run on, a subset of :data:`RUNTIMES`.
        runtime: The runtime picked at construction.
        cache_dir: Where derived artefacts live.
        threads: Intra-op threads given to the runtime.
    """

    name: ClassVar[str]
    runtimes: ClassVar[tuple[str, ...]]

    def __init__(
        self, *, runtime: str = "onnxruntime", cache_dir: Path | None = None, threads: int = 1
    ) -> None:
        if runtime not in self.runtimes:
            known = ", ".join(self.runtimes)
            raise ValueError(f"stage {self.name!r} cannot run on {runtime!r} (runtimes: {known})")
        if threads < 1:
            raise ValueError(f"threads must be a positive integer, got {threads}")
        self.runtime = runtime
        self.cache_dir = model_cache_dir(cache_dir)
        self.threads = threads
        self._lock = threading.RLock()
        self._prepared = False
        self._loaded = False

    def prepare(self) -> None:
        """Create derived artefacts in :attr:`cache_dir` if they are missing (idempotent)."""
        with self._lock:
            if self._prepared:
                return
            offline_hub()
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            self._prepare()
            self._prepared = True

    def load(self) -> None:
        """Prepare if needed, then open the runtime sessions (idempotent)."""
        with self._lock:
            if self._loaded:
                return
            self.prepare()
            self._load()
            self._loaded = True

    @property
    def loaded(self) -> bool:
        """Whether :meth:`load` has completed and :meth:`close` has not been called since."""
        return self._loaded

    def close(self) -> None:
        """Drop the sessions; a later call loads them again."""
        with self._lock:
            if self._loaded:
                self._close()
            self._loaded = False

    @abc.abstractmethod
    def graph(self, variant: str = "full") -> ComputeGraph:
        """The main network of this stage with its cost hint, for the cost model.

        Prepares artefacts if needed (the graph's source is a file in the cache).
        """

    def _prepare(self) -> None:  # noqa: B027 - optional hook
        """Write derived artefacts; the default has none."""

    @abc.abstractmethod
    def _load(self) -> None:
        """Open sessions; called once under the lock, after :meth:`_prepare`."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release sessions."""

    @staticmethod
    def _check_variant(variant: str) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r} (variants: {', '.join(VARIANTS)})")

    def __repr__(self) -> str:
        state = "loaded" if self._loaded else "not loaded"
        return f"<{type(self).__name__} {self.name} on {self.runtime}, {state}>"
