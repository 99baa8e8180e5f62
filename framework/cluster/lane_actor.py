"""A (stage, device) lane's node side: the actor that holds the stage's resident models on one
device of its node and runs the batches the front door's lane sends it.

Inputs that earlier stages left in Ray's object store arrive as :class:`RayOutput` stand-ins
and are read here, on this node (from its own store when the producer ran on the same node,
pulled from the producer's node otherwise); outputs stay in this node's store, and the front
door gets back only what the scheduler needs: sizes, shapes and per-item errors. Like the node
agent, this file knows Ray only through the object refs it is handed: the cluster module makes
it an actor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hetero.framework.engine.lanes import DeviceModels
from hetero.framework.graph import GraphFormat
from hetero.framework.registry import Registry, default_registry
from hetero.framework.remote import RemoteValue
from hetero.framework.stage_plugin import StagePlugin

__all__ = ["LOST", "ItemShape", "LaneActor", "RayOutput", "RayOutputs"]

LOST = "lost"  # a run's answer when its inputs could not be read: their node is gone
# ("error", the exception) | ("map", {key: (nbytes, shape)}) | ("value", (nbytes, shape))
ItemShape = tuple[str, Any]


class RayOutput(RemoteValue):
    """One output (or one array of it) of an item a lane actor ran, kept in its node's store."""

    def __init__(
        self, ref: Any, index: int, key: str | None, device_id: str, nbytes: int, shape: Any
    ) -> None:
        self.ref = ref
        self.index = index
        self.key = key
        self.device_id = device_id
        self.nbytes = nbytes
        self.shape = tuple(shape)

    def fetch(self) -> Any:
        import ray

        return self.pick(ray.get(self.ref))

    def pick(self, batch: list[Any]) -> Any:
        """This output out of its batch's results."""
        item = batch[self.index]
        return item if self.key is None else item[self.key]


class RayOutputs(Mapping[str, RayOutput], RemoteValue):
    """A dict output of one item (a bare graph's named arrays), each array a :class:`RayOutput`:
    the engine merges and filters it by name without fetching anything."""

    def __init__(self, parts: dict[str, RayOutput], template: RayOutput) -> None:
        self._parts = parts
        self._whole = template
        self.nbytes = sum(part.nbytes for part in parts.values())

    def __getitem__(self, key: str) -> RayOutput:
        return self._parts[key]

    def __iter__(self) -> Any:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def fetch(self) -> Any:
        return self._whole.fetch()


def describe(value: Any) -> ItemShape:
    """What the front door keeps of one result: its error, or its sizes and shapes."""
    if isinstance(value, BaseException):
        return "error", value
    if isinstance(value, Mapping):
        return "map", {str(k): _measure(v) for k, v in value.items()}
    return "value", _measure(value)


def _measure(value: Any) -> tuple[int, tuple[int, ...]]:
    if isinstance(value, np.ndarray):
        return int(value.nbytes), tuple(value.shape)
    if isinstance(value, bytes | str):
        return len(value), ()
    return 0, ()


class LaneActor:
    """One stage's models on one device of this node, and the runs of its batches."""

    def __init__(
        self, plugin: StagePlugin, device_id: str, registry: Registry | None = None
    ) -> None:
        registry = registry or default_registry()
        backend = registry.backend(device_id.split(":", 1)[0])
        self.plugin = plugin
        self.models = DeviceModels(backend, backend.device(device_id))
        plugin.prepare()  # idempotent: files another node made are made here too
        plugin.setup()

    def ready(self) -> bool:
        """Answers once the actor is up (its plugin set up on the node)."""
        return True

    def load(self, model_key: str, graph_format: GraphFormat, threads: int) -> bool:
        """Make ``model_key`` resident on the device (True: loaded now)."""
        return self.models.load(self.plugin, model_key, graph_format, threads)

    def run(
        self, model_key: str, graph_format: GraphFormat, threads: int, payloads: list[Any]
    ) -> tuple[Any, list[Any]]:
        """Run a batch: ((load_s, run_s, a shape per item) or (LOST, why), the results).
        Called with two returns: the first comes back to the front door, the second stays in
        this node's object store."""
        try:
            local = _resolve(payloads)
        except Exception as err:  # Ray's ObjectLostError family: the producer's node is gone
            if type(err).__module__.startswith("ray"):
                return (LOST, f"{type(err).__name__}: {err}"), []
            raise
        ran = self.models.run_batch(self.plugin, model_key, graph_format, threads, local)
        shapes = [describe(result) for result in ran.results]
        kept = [None if isinstance(r, BaseException) else r for r in ran.results]
        return (ran.load_s, ran.run_s, shapes), kept

    def evict(self, model_key: str) -> None:
        """Release ``model_key`` (the memory manager's decision)."""
        self.models.evict(model_key)

    def close(self) -> None:
        """Release everything this lane holds."""
        self.models.close()
        self.plugin.close()


def _resolve(payloads: list[Any]) -> list[Any]:
    """``payloads`` with every :class:`RayOutput` replaced by its value, each batch of results
    read once (from this node's store when it was made here)."""
    outputs: list[RayOutput] = []
    _collect(payloads, outputs)
    if not outputs:
        return payloads
    import ray

    refs = {o.ref.hex(): o.ref for o in outputs}
    batches = dict(zip(refs, ray.get(list(refs.values())), strict=True))
    return [_substitute(p, batches) for p in payloads]


def _collect(value: Any, into: list[RayOutput]) -> None:
    if isinstance(value, RayOutputs):
        into.extend(value.values())
    elif isinstance(value, RayOutput):
        into.append(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            _collect(item, into)
    elif isinstance(value, list | tuple):
        for item in value:
            _collect(item, into)


def _substitute(value: Any, batches: dict[str, list[Any]]) -> Any:
    if isinstance(value, RayOutputs):
        return {key: _substitute(part, batches) for key, part in value.items()}
    if isinstance(value, RayOutput):
        return value.pick(batches[value.ref.hex()])
    if isinstance(value, Mapping):
        return {key: _substitute(item, batches) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_substitute(item, batches) for item in value)
    return value
