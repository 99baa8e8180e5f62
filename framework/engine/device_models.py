"""The graphs resident on one device of this process (:class:`DeviceModels`, the local
:class:`ModelHost`) and what one run of a batch on a device gives back (:class:`BatchRun`). A
lane (:mod:`.lanes`) runs its batches through a model host; a Ray node's device is another
(``framework/cluster``)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from hetero.framework.backend import Backend
from hetero.framework.devices import DeviceSpec
from hetero.framework.engine.heap import collect_frozen
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.runner import LoadedGraphs
from hetero.framework.stage_plugin import StagePlugin

__all__ = ["BatchRun", "DeviceModels", "ModelHost", "with_threads"]

logger = logging.getLogger(__name__)

_GraphsKey = tuple[str, GraphFormat, int]  # a stage's graphs in one format, by intra-op threads


@dataclass(frozen=True, slots=True)
class BatchRun:
    """One plugin call on a device: a result per payload (a value or the exception that item
    raised), the load it waited for and the run's own time, both measured where it ran."""

    results: list[Any]
    load_s: float
    run_s: float


class ModelHost(Protocol):
    """Where one device's resident models are held and its stages' batches run: this process
    (:class:`DeviceModels`) or a cluster node (a Ray actor per device). Loads and
    evictions are the memory manager's decisions, carried out here."""

    device: DeviceSpec

    def load(
        self, plugin: StagePlugin, model_key: str, graph_format: GraphFormat, threads: int
    ) -> bool:
        """Make ``model_key`` resident (True: it was loaded now)."""
        ...

    def run_batch(
        self,
        plugin: StagePlugin,
        model_key: str,
        graph_format: GraphFormat,
        threads: int,
        payloads: list[Any],
    ) -> BatchRun:
        """Run a batch of ``model_key`` (loading it first if needed). Raises when the
        device failed (the load or the whole run)."""
        ...

    def evict(self, model_key: str) -> None:
        """Forget ``model_key``; its graphs are released once no variant uses them."""
        ...

    def resident(self, model_key: str) -> bool:
        """Whether ``model_key`` is resident."""
        ...

    def close(self) -> None:
        """Release everything."""
        ...


class DeviceModels:
    """The stage graphs resident on one device of this process, by model key
    (``stage/variant``): the local :class:`ModelHost`.

    Variants that load the same graphs share one resident copy; it is released when the last
    variant using it is evicted. A stage's graphs are held once per thread count they ran with
    (a contended batch runs on a copy with fewer threads: :mod:`.thread_budget`); evicting a
    variant releases every copy it used.
    """

    def __init__(self, backend: Backend, device: DeviceSpec) -> None:
        self.backend = backend
        self.device = device
        self._lock = threading.Lock()
        self._loaded: dict[_GraphsKey, LoadedGraphs] = {}
        self._users: dict[_GraphsKey, set[str]] = {}
        self._keys_of: dict[str, set[_GraphsKey]] = {}
        self._loading: dict[_GraphsKey, threading.Lock] = {}
        self._closed = False

    def get(
        self,
        model_key: str,
        graph_format: GraphFormat,
        graphs: Callable[[], Mapping[str, Any]],
        threads: int = 0,
    ) -> tuple[LoadedGraphs, bool]:
        """The loaded graphs of ``model_key`` with ``threads`` intra-op threads, loading them
        if needed; (runner, loaded now)."""
        stage = model_key.split("/", 1)[0]
        key = (stage, graph_format, threads)
        with self._lock:
            gate = self._loading.setdefault(key, threading.Lock())
        with gate:  # one load per graph set; others wait for it
            with self._lock:
                found = self._loaded.get(key)
                if found is not None:
                    self._users[key].add(model_key)
                    self._keys_of.setdefault(model_key, set()).add(key)
                    return found, False
            if self._is_closed():
                raise RuntimeError(f"{self.device.id} is closed: nothing more is loaded")
            loaded = LoadedGraphs(self.backend, self.device.id, graphs())
            with self._lock:
                closed = self._is_closed()
                if not closed:
                    self._loaded[key] = loaded
                    self._users[key] = {model_key}
                    self._keys_of.setdefault(model_key, set()).add(key)
            if closed:  # closed while loading: give it straight back
                loaded.unload()
                raise RuntimeError(f"{self.device.id} closed while {model_key} was loading")
            return loaded, True

    def _is_closed(self) -> bool:
        return self._closed

    def load(
        self, plugin: StagePlugin, model_key: str, graph_format: GraphFormat, threads: int
    ) -> bool:
        """Make ``model_key`` resident (True: it was loaded now)."""
        return self._runner(plugin, model_key, graph_format, threads)[1]

    def _runner(
        self, plugin: StagePlugin, model_key: str, graph_format: GraphFormat, threads: int
    ) -> tuple[LoadedGraphs, bool]:
        variant = model_key.split("/", 1)[1]
        return self.get(
            model_key,
            graph_format,
            lambda: with_threads(plugin.graphs(variant, graph_format), threads),
            threads,
        )

    def run_batch(
        self,
        plugin: StagePlugin,
        model_key: str,
        graph_format: GraphFormat,
        threads: int,
        payloads: list[Any],
    ) -> BatchRun:
        """Load ``model_key`` if needed and run ``plugin`` over ``payloads`` with it."""
        loading = time.perf_counter()
        runner, loaded = self._runner(plugin, model_key, graph_format, threads)
        began = time.perf_counter()
        results = plugin.run(runner, model_key.split("/", 1)[1], payloads)
        if len(results) != len(payloads):
            raise RuntimeError(
                f"stage {plugin.name}: run() gave {len(results)} results for {len(payloads)} items"
            )
        return BatchRun(results, began - loading if loaded else 0.0, time.perf_counter() - began)

    def evict(self, model_key: str) -> None:
        """Forget ``model_key``; its graphs (each copy) are unloaded once no variant uses
        them."""
        self._release(model_key, None)

    def release_copy(self, model_key: str, threads: int) -> None:
        """Unload the copy of ``model_key``'s graphs with ``threads`` intra-op threads (one
        that warm-up timed) once no other variant uses it; its other copies stay."""
        self._release(model_key, threads)

    def _release(self, model_key: str, threads: int | None) -> None:
        """Drop ``model_key``'s use of its copies (those with ``threads`` threads; None:
        all), unloading each copy no variant uses any more."""
        released: list[tuple[_GraphsKey, LoadedGraphs]] = []
        with self._lock:
            keys = self._keys_of.get(model_key, set())
            for key in [k for k in keys if threads is None or k[2] == threads]:
                keys.discard(key)
                users = self._users.get(key, set())
                users.discard(model_key)
                if users:
                    continue
                loaded = self._loaded.pop(key, None)
                self._users.pop(key, None)
                if loaded is not None:
                    released.append((key, loaded))
            if not keys:
                self._keys_of.pop(model_key, None)
        for key, loaded in released:
            try:
                loaded.unload()
            except Exception:
                logger.exception("%s: unloading %s failed", self.device.id, key[0])
        if released:
            collect_frozen()  # their cyclic garbage, if start-up's objects were frozen

    def resident(self, model_key: str) -> bool:
        """Whether ``model_key``'s graphs are loaded here."""
        with self._lock:
            return model_key in self._keys_of

    def close(self) -> None:
        """Unload everything; a load still running gives its graphs back when it ends."""
        with self._lock:
            self._closed = True
            loaded = list(self._loaded.values())
            self._loaded.clear()
            self._users.clear()
            self._keys_of.clear()
        for graphs in loaded:
            graphs.unload()


def with_threads(graphs: Mapping[str, ComputeGraph], threads: int) -> dict[str, ComputeGraph]:
    """``graphs`` with ``threads`` intra-op threads each (0 leaves them as they are)."""
    if threads <= 0:
        return dict(graphs)
    return {name: dataclasses.replace(graph, threads=threads) for name, graph in graphs.items()}
