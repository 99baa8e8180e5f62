"""What every built-in model stage shares: the plugin contract, artefacts, standalone use.

A stage is built cheaply (no imports of torch or a runtime, no file access); :meth:`prepare`
writes derived artefacts (an exported ONNX file, a converted state dict) into the model cache
once; :meth:`setup` loads what :meth:`run` needs beside its graphs (tokenizers, label names).
The engine loads the graphs on the device it places the stage on and calls :meth:`run` with
that device's runner. Used by itself (a test, a notebook), a stage loads its graphs on the host
device of its ``runtime`` through the same backend (:meth:`load`), and its convenience methods
(``embed``, ``read``, ...) call :meth:`run` with that runner: one code path either way.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.request_profile import RequestProfile
from hetero.framework.runner import LoadedGraphs, open_graphs
from hetero.framework.stage_plugin import GraphRunner, StagePlugin
from hetero.models.assets import model_cache_dir, offline_hub

__all__ = [
    "RUNTIMES",
    "RUNTIME_DEVICES",
    "VARIANTS",
    "ModelStage",
    "audio_profile",
    "image_profile",
    "text_profile",
]

RUNTIMES = ("onnxruntime", "openvino", "torch")
VARIANTS = ("full", "light")
RUNTIME_DEVICES = {
    "onnxruntime": "npu:onnxruntime/CPUExecutionProvider",
    "openvino": "npu:openvino/CPU",
    "torch": "npu:torch/cpu",
}
"""The host device a stage used by itself runs on, per runtime library."""
_RUNTIME_FORMATS = {
    "onnxruntime": GraphFormat.ONNX,
    "openvino": GraphFormat.ONNX,
    "torch": GraphFormat.TORCH,
}


def image_profile(data: bytes) -> RequestProfile:
    """Pixels of an image from its header (nothing is decoded)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
    return RequestProfile.of_image(width, height)


def audio_profile(data: bytes) -> RequestProfile:
    """Seconds of an audio file from its header (nothing is decoded)."""
    import io

    import soundfile

    info = soundfile.info(io.BytesIO(data))
    return RequestProfile.of_audio(float(info.frames) / float(info.samplerate))


def text_profile(characters: int) -> RequestProfile:
    """Tokens of text, estimated from its length (4 characters a token)."""
    return RequestProfile(text_tokens=characters // 4)


class ModelStage(StagePlugin):
    """A real model behind one policy stage.

    Attributes:
        name: The policy stage kind (``vision_encode``, ``asr``...).
        runtimes: The runtime libraries its graphs run on, a subset of :data:`RUNTIMES`.
        runtime: Where it runs when used by itself (the engine places it instead).
        cache_dir: Where derived artefacts live.
        threads: Intra-op threads for its graphs when used by itself.
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
        self._set_up = False
        self._own: LoadedGraphs | None = None

    def __getstate__(self) -> dict[str, Any]:
        """What goes to another process (a Ray node's lane actor): its configuration and what
        :meth:`setup` made, not its lock or the graphs it loaded for use by itself."""
        state = dict(self.__dict__)
        state.pop("_lock", None)
        state["_own"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    @property
    def formats(self) -> tuple[GraphFormat, ...]:
        """Graph formats this stage offers, preferred first (the engine picks per device)."""
        return tuple(dict.fromkeys(_RUNTIME_FORMATS[r] for r in self.runtimes))

    def prepare(self) -> None:
        """Create derived artefacts in :attr:`cache_dir` if they are missing (idempotent)."""
        with self._lock:
            if self._prepared:
                return
            offline_hub()
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            self._prepare()
            self._prepared = True

    def setup(self) -> None:
        """Prepare if needed, then load what :meth:`run` needs beside its graphs (idempotent)."""
        with self._lock:
            if self._set_up:
                return
            self.prepare()
            self._setup()
            self._set_up = True

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        """The stage's graphs for ``variant`` in ``graph_format`` (the preferred one by
        default), with their cost hints. Cheap: their files exist once :meth:`prepare` ran."""
        self._check_variant(variant)
        chosen = GraphFormat(graph_format) if graph_format is not None else self.formats[0]
        if chosen not in self.formats:
            offered = ", ".join(f.value for f in self.formats)
            raise ValueError(f"stage {self.name!r} has no {chosen.value} graphs ({offered})")
        return self._graphs(variant, chosen)

    # --- used by itself -----------------------------------------------------------------

    def load(self) -> None:
        """Set up, then load the graphs on the host device of :attr:`runtime` (idempotent)."""
        with self._lock:
            if self._own is not None:
                return
            self.setup()
            graphs = self.graphs("full", _RUNTIME_FORMATS[self.runtime])
            graphs = {
                name: dataclasses.replace(graph, threads=self.threads)
                for name, graph in graphs.items()
            }
            self._own = open_graphs(graphs, RUNTIME_DEVICES[self.runtime])

    @property
    def loaded(self) -> bool:
        """Whether :meth:`load` has completed and :meth:`close` has not been called since."""
        return self._own is not None

    @property
    def runner(self) -> GraphRunner:
        """The runner of the stage used by itself (loads on first use)."""
        self.load()
        assert self._own is not None
        return self._own

    def close(self) -> None:
        """Release the graphs loaded by :meth:`load`; a later call loads them again."""
        with self._lock:
            own, self._own = self._own, None
        if own is not None:
            own.unload()

    def _call(self, variant: str, payload: Any) -> Any:
        """One request through :meth:`run` on this stage's own runner; raises its error."""
        self._check_variant(variant)
        (result,) = self.run(self.runner, variant, [payload])
        if isinstance(result, BaseException):
            raise result
        return result

    # --- for subclasses -----------------------------------------------------------------

    @abc.abstractmethod
    def _graphs(self, variant: str, graph_format: GraphFormat) -> Mapping[str, ComputeGraph]:
        """The graphs in ``graph_format`` (one of :attr:`formats`); sources may be files
        :meth:`prepare` creates."""

    def _prepare(self) -> None:
        """Write derived artefacts; the default has none."""

    def _setup(self) -> None:
        """Load tokenizers and the like; called once under the lock, after :meth:`_prepare`."""

    @staticmethod
    def _check_variant(variant: str) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r} (variants: {', '.join(VARIANTS)})")

    def __repr__(self) -> str:
        state = "loaded" if self.loaded else "not loaded"
        return f"<{type(self).__name__} {self.name} on {self.runtime}, {state}>"
