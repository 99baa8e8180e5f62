"""Stand-ins for outputs a Ray device actor keeps (:mod:`~hetero.framework.cluster.kept`): what
the engine holds and passes to the next stage instead of the arrays themselves.

Every stand-in of one batch shares a :class:`KeptBatch`: the actor that keeps it, its batch id
and the device. Once the front door's copy is dropped (the request is over and nothing else
holds it) its batch id goes to ``on_drop``: the device's host sends the ids it gathered with its
next call to that actor (no call of their own); the copies a stage's payload carries to
another actor release nothing.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hetero.framework.errors import InputLostError
from hetero.framework.remote import RemoteValue

__all__ = [
    "CONTROL_GROUP",
    "CONTROL_THREADS",
    "KeptBatch",
    "RayOutput",
    "RayOutputs",
    "collect",
    "sources",
    "stand_in",
]


class KeptBatch:
    """One batch of outputs kept in a device actor: ``actor`` is its Ray handle where this
    process has one (the front door), ``actor_name`` finds it anywhere else (a handle costs
    Ray's serialiser about 0.3 ms a call to carry; a stage on the same device never uses it)."""

    def __init__(
        self,
        actor: Any,
        batch_id: str,
        device_id: str,
        on_drop: Callable[[str], None] | None = None,
        actor_name: str = "",
    ) -> None:
        self.actor = actor
        self.batch_id = batch_id
        self.device_id = device_id
        self.actor_name = actor_name
        if on_drop is not None:  # the front door's: its end releases the batch on the node
            finalizer = weakref.finalize(self, on_drop, batch_id)
            finalizer.atexit = False

    def __reduce__(self) -> tuple[Any, ...]:
        actor = None if self.actor_name else self.actor
        return KeptBatch, (actor, self.batch_id, self.device_id, None, self.actor_name)

    def handle(self) -> Any:
        """The keeping actor's handle (looked up by name once per process)."""
        if self.actor is not None:
            return self.actor
        with _handles_lock:
            found = _handles.get(self.actor_name)
        if found is None:
            import ray

            found = ray.get_actor(self.actor_name)
            with _handles_lock:
                _handles[self.actor_name] = found
        return found

    def pick(self, picks: list[tuple[int, str | None]]) -> list[Any]:
        """Outputs of this batch brought to the caller (an actor call)."""
        import ray

        try:
            pick = self.handle().pick.options(concurrency_group=CONTROL_GROUP)
            found = ray.get(pick.remote(self.batch_id, picks))
        except (ray.exceptions.RayError, ValueError) as err:  # its actor died, or is unknown
            raise InputLostError((self.device_id,), f"its device actor is gone ({err})") from err
        if found is None:
            raise InputLostError((self.device_id,), "its kept outputs were dropped for room")
        return list(found)


# A device actor's own threads (a Ray concurrency group) for picks, stops and releases: runs
# never take them, so a stop reaches a generation however many runs fill the other threads.
CONTROL_GROUP = "control"
CONTROL_THREADS = 4
_handles: dict[str, Any] = {}  # device actors by name, in this process
_handles_lock = threading.Lock()


class RayOutput(RemoteValue):
    """One output (or one array of it) of an item a device actor ran, kept there."""

    def __init__(
        self, batch: KeptBatch, index: int, key: str | None, nbytes: int, shape: Any
    ) -> None:
        self.batch = batch
        self.index = index
        self.key = key
        self.nbytes = nbytes
        self.shape = tuple(shape)

    @property
    def device_id(self) -> str:
        """The device whose actor keeps it."""
        return self.batch.device_id

    def fetch(self) -> Any:
        (value,) = self.batch.pick([(self.index, self.key)])
        return value


class RayOutputs(Mapping[str, RayOutput], RemoteValue):
    """A dict output of one item (a bare graph's named arrays), each array a :class:`RayOutput`:
    the engine merges and filters it by name without fetching anything."""

    def __init__(self, parts: dict[str, RayOutput], whole: RayOutput) -> None:
        self._parts = parts
        self._whole = whole
        self.nbytes = sum(part.nbytes for part in parts.values())

    def __getitem__(self, key: str) -> RayOutput:
        return self._parts[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    @property
    def device_id(self) -> str:
        """The device whose actor keeps it."""
        return self._whole.device_id

    def fetch(self) -> Any:
        return self._whole.fetch()


def collect(value: Any, into: list[RayOutput]) -> None:
    """Every :class:`RayOutput` in ``value`` (dicts, lists, tuples), into ``into``."""
    if isinstance(value, RayOutputs):
        into.extend(value.values())
    elif isinstance(value, RayOutput):
        into.append(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            collect(item, into)
    elif isinstance(value, list | tuple):
        for item in value:
            collect(item, into)


def sources(value: Any) -> set[str]:
    """Devices whose kept outputs ``value`` stands in for."""
    found: list[RayOutput] = []
    collect(value, found)
    return {output.device_id for output in found}


def stand_in(batch: KeptBatch | None, index: int, shape: tuple[str, Any]) -> Any:
    """What the engine holds for one item: its error, its value, or stand-ins for what the
    device's actor kept."""
    kind, detail = shape
    if kind in ("error", "inline"):
        return detail
    assert batch is not None  # a kept item always comes with its batch id
    if kind == "map":
        parts = {
            key: RayOutput(batch, index, key, nbytes, dims)
            for key, (nbytes, dims) in detail.items()
        }
        return RayOutputs(parts, RayOutput(batch, index, None, 0, ()))
    nbytes, dims = detail
    return RayOutput(batch, index, None, nbytes, dims)
