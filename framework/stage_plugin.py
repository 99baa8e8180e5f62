"""The stage plugin contract: what every model plugin implements, first-party and third-party.

A plugin names its graphs with their :class:`~hetero.framework.graph.BandwidthHint` (the one
source of cost for the scheduler and the simulator), judges a request cheaply for admission,
says what content identifies a request for the feature cache, and runs a batch of requests:
pre-processing, its graphs through a :class:`GraphRunner` bound to the device the scheduler
placed it on, loops (a KV cache through :meth:`GraphRunner.native`) and post-processing.
Streamed outputs (LLM text) flow back through the request's own callback
(:class:`Generation`), item by item, while ``run`` is still going.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from hetero.framework.errors import BackendError, DeviceError
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.policy import Policy
from hetero.framework.registry import Registry
from hetero.framework.request_profile import RequestProfile

__all__ = [
    "Generation",
    "GraphRunner",
    "StagePlugin",
    "combined_hint",
    "each",
    "plugin_hints",
    "stage_kind",
    "stage_plugins",
]

Arrays = Mapping[str, np.ndarray[Any, Any]]


class GraphRunner(Protocol):
    """A stage's graphs, loaded on one device; what :meth:`StagePlugin.run` calls them through."""

    @property
    def device_id(self) -> str:
        """The device the graphs are loaded on (``npu:openvino/CPU``, ``cuda:0``)."""
        ...

    @property
    def torch_device(self) -> str | None:
        """Where torch tensors for a native torch graph go (``cpu``, ``cuda:0``); None when
        the device does not run torch."""
        ...

    def run(self, graph: str, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        """Run graph ``graph`` once on the device: named host arrays in, named host arrays out."""
        ...

    def native(self, graph: str) -> Any:
        """The device-native handle of graph ``graph`` (a torch module on its device, an ONNX
        Runtime session, a :class:`~hetero.framework.text_engine.TextEngine`), for a loop the
        stage drives itself; the loop's runtime calls go inside
        :func:`hetero.framework.faults.native_faults`, so a device fault is one."""
        ...


@dataclass(eq=False)
class Generation:
    """A streamed LLM request: ``on_piece`` gets each piece of text as it is made (from the
    device's worker thread); setting ``stop`` ends generation early (a client that left).
    ``stop_sequences`` end it where one first appears; the text stops before it."""

    messages: Sequence[Mapping[str, str]]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    on_piece: Callable[[str], None] = lambda piece: None
    stop: threading.Event = field(default_factory=threading.Event)
    stop_sequences: tuple[str, ...] = ()
    prompt_ids: tuple[int, ...] | None = None
    """The prompt's token ids, made once where the request was read (None: the plugin
    tokenizes ``messages`` itself)."""


class StagePlugin(abc.ABC):
    """A model behind a policy stage, as the engine runs it.

    Class attributes: ``name`` is the stage kind it serves (``vision_encode``, ``ocr``, ...);
    ``batchable`` says whether several requests go into one :meth:`run` call as one batch.
    Construction is cheap (no runtime imports, no file access); :meth:`prepare` writes
    derived artefacts once.
    """

    name: ClassVar[str]
    batchable: ClassVar[bool] = False
    model_ids: ClassVar[tuple[str, ...]] = ()
    """Model ids (a policy stage's ``model_version`` before ``@``) it serves under any stage
    name, so a stage ``id_card_ocr`` with ``model_version: pp-ocrv4@1`` finds the OCR plugin."""
    device_ids: tuple[str, ...] | None = None
    """Where it may be placed, when only some devices will do (a partition's sandbox)."""

    @property
    def formats(self) -> tuple[GraphFormat, ...]:
        """Graph formats it offers, preferred first; on each device the engine loads the
        first one the device takes for the main (first) graph. Empty: it loads no graphs."""
        return (GraphFormat.ONNX,)

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Create derived artefacts (an exported ONNX file) if missing; idempotent."""

    def setup(self) -> None:  # noqa: B027 - optional hook
        """Load what :meth:`run` needs beside its graphs (tokenizers, label names); once."""

    @abc.abstractmethod
    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        """The graphs this stage runs for ``variant`` in ``graph_format`` (the preferred one
        by default), by name, main graph first, with their cost hints."""

    @abc.abstractmethod
    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        """One result per payload, in order: a plain value (dict, array, bytes), or the
        exception instance that item raised (bad input fails its item, never its batch)."""

    def items(self, payload: Any) -> int:
        """How many nominal items of the cost hint one payload is (texts in a group)."""
        return 1

    def split(self, payload: Any, max_items: int) -> list[Any]:
        """``payload`` as parts that each make one bounded model call: at most ``max_items``
        items, and within the plugin's own bound on what one call may hold (memory, time).
        A large request then runs part after part, with other requests between its parts.
        The default splits a list payload by item count and keeps anything else whole."""
        if not isinstance(payload, list) or len(payload) <= max_items:
            return [payload]
        return [payload[start : start + max_items] for start in range(0, len(payload), max_items)]

    def profile(self, payload: Any) -> RequestProfile | None:
        """How heavy one payload is, measured cheaply (an image's header, an audio file's
        length, text length), for admission; None: not judged."""
        return None

    def probe_payload(self) -> Any:
        """A small representative request, to calibrate the cost model at warm-up (None: the
        stage is not probed)."""
        return None

    def kv_tokens(self, payload: Any, output_tokens: int) -> int:
        """Tokens of context one payload holds in a KV cache at its longest if it generates
        ``output_tokens`` (its prompt plus those, within its own bound): what the scheduler
        reserves and places a sequence by. 0: the stage keeps no KV cache."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the plugin holds outside its graphs (tokenizers, helpers)."""


def each(function: Callable[[Any], Any], payloads: Sequence[Any]) -> list[Any]:
    """``function`` over each payload; an item that raises gets its exception as its result
    (bad input fails its item, not its batch). A backend's or device's error (the device
    failed, not the input) is raised: the engine retries the batch on another device and the
    (stage, device) breaker counts it. A loop over a native handle names the runtime's own
    exceptions first, with :func:`hetero.framework.faults.native_faults`."""
    results: list[Any] = []
    for payload in payloads:
        try:
            results.append(function(payload))
        except (BackendError, DeviceError):
            raise
        except Exception as err:
            results.append(err)
    return results


def combined_hint(graphs: Mapping[str, ComputeGraph]) -> BandwidthHint:
    """The cost of one item through all of a stage's graphs: FLOPs, bytes and resident memory
    add up; the batch is as large as the smallest graph allows."""
    hints = [graph.hint for graph in graphs.values()]
    if not hints:
        return BandwidthHint(flops_per_item=0.0, bytes_per_item=0.0)
    first = next(iter(graphs.values())).hint
    batchable = all(h.batchable for h in hints)
    return BandwidthHint(
        flops_per_item=sum(h.flops_per_item for h in hints),
        bytes_per_item=sum(h.bytes_per_item for h in hints),
        input_bytes=first.input_bytes,
        output_bytes=hints[-1].output_bytes,
        resident_bytes=sum(h.resident_bytes for h in hints),
        batchable=batchable,
        max_batch=min(h.max_batch for h in hints) if batchable else 1,
        dtype=first.dtype,
    )


def stage_plugins(registry: Registry) -> dict[str, Any]:
    """{kind: plugin class} of every ``stage_model`` plugin, first-party and third-party."""
    registry.load_plugins()
    return dict(registry.extensions("stage_model"))


def stage_kind(name: str, model_version: str, classes: Mapping[str, Any]) -> str | None:
    """The plugin kind that serves policy stage ``name``: the one whose ``model_ids`` holds
    its ``model_version`` (before ``@``), else the one named like the stage; None if none."""
    base = model_version.split("@", 1)[0].lower()
    for kind, cls in classes.items():
        if base in getattr(cls, "model_ids", ()):
            return kind
    return name if name in classes else None


def plugin_hints(policy: Policy, classes: Mapping[str, Any]) -> dict[str, BandwidthHint]:
    """``stage/variant`` -> the cost of one item of that variant, from the graphs of the plugin
    that serves the stage (no artefacts are built: hints are figures, not files). Stages no
    plugin serves keep the figures their policy gives."""
    hints: dict[str, BandwidthHint] = {}
    for name, config in policy.spec.stages.items():
        if config.partition is not None:
            continue  # runs in its sandbox; costed by the host-side figures of the policy
        kind = stage_kind(name, config.model_version, classes)
        if kind is None:
            continue
        plugin = classes[kind]()
        for variant in config.variants:
            hints[f"{name}/{variant}"] = combined_hint(plugin.graphs(str(variant)))
    return hints
