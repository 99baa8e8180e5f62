"""Outputs a Ray device actor keeps in its own memory until the next stage or the response
reads them.

A batch's results that are too large to travel back with the answer stay in the actor that
made them, under a batch id: a later stage on the same device reads them there without a copy
(no object store, no serialisation); a stage elsewhere, or the front door, asks the actor for
them (:meth:`KeptStore.pick`), and only then do they move. The front door releases a batch
when its last stand-in is dropped; past :data:`KEPT_BYTES` the oldest batches go first (a
stage that reads them then finds them gone, and the engine makes them again, as for a node that
left; a request's final output gone by the time the front door fetches it fails that request).
Knows nothing of Ray.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hetero.framework.sizes import nbytes_of

__all__ = ["INLINE_BYTES", "KEPT_BYTES", "ItemShape", "KeptStore", "describe", "measure"]

INLINE_BYTES = 64 * 2**10  # an item's outputs up to this size come back with the answer
KEPT_BYTES = 512 * 2**20  # what one device actor keeps at most; the oldest batches go first
# ("error", the exception) | ("inline", the value) | ("map", {key: (nbytes, shape)})
# | ("value", (nbytes, shape))
ItemShape = tuple[str, Any]


def measure(value: Any) -> tuple[int, tuple[int, ...]]:
    """Bytes and shape of one output value (0 and () where it has no known size)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes), tuple(value.shape)
    return nbytes_of(value), ()


def describe(value: Any) -> ItemShape:
    """What the front door gets of one result: its error, the value itself when it is small,
    or its sizes and shapes (the value is kept)."""
    if isinstance(value, BaseException):
        return "error", value
    if isinstance(value, Mapping):
        parts = {str(k): measure(v) for k, v in value.items()}
        if sum(nbytes for nbytes, _ in parts.values()) <= INLINE_BYTES:
            return "inline", value
        return "map", parts
    nbytes, shape = measure(value)
    return ("inline", value) if nbytes <= INLINE_BYTES else ("value", (nbytes, shape))


class KeptStore:
    """Batches of results by id, oldest first, bounded in bytes."""

    def __init__(self, limit_bytes: int = KEPT_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self._batches: OrderedDict[str, tuple[list[Any], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.served = 0  # picks answered for readers in other processes
        self.dropped = 0  # batches that went for room before they were released

    def keep(self, batch_id: str, results: list[Any], nbytes: int) -> None:
        """Keep ``results`` (None where an item is not kept) under ``batch_id``."""
        with self._lock:
            self._batches[batch_id] = (results, nbytes)
            self._bytes += nbytes
            while self._bytes > self.limit_bytes and len(self._batches) > 1:
                _, (_, freed) = self._batches.popitem(last=False)
                self._bytes -= freed
                self.dropped += 1

    def get(self, batch_id: str) -> list[Any] | None:
        """A batch's results, read in this process (None: released or dropped)."""
        with self._lock:
            found = self._batches.get(batch_id)
        return None if found is None else found[0]

    def pick(self, batch_id: str, picks: Sequence[tuple[int, str | None]]) -> list[Any] | None:
        """Outputs of a batch for a reader elsewhere: item ``index``'s whole result, or one
        ``key`` of it, per pick (None: the batch is gone)."""
        results = self.get(batch_id)
        if results is None:
            return None
        with self._lock:
            self.served += 1
        return [pick_from(results, index, key) for index, key in picks]

    def release(self, batch_id: str) -> None:
        """Forget a batch (its last stand-in in the front door was dropped)."""
        with self._lock:
            found = self._batches.pop(batch_id, None)
            if found is not None:
                self._bytes -= found[1]

    def stats(self) -> dict[str, int]:
        """Batches and bytes kept now, picks served to other processes, batches dropped."""
        with self._lock:
            return {
                "batches": len(self._batches),
                "bytes": self._bytes,
                "served": self.served,
                "dropped": self.dropped,
            }

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._batches.clear()
            self._bytes = 0


def pick_from(results: list[Any], index: int, key: str | None) -> Any:
    """Item ``index``'s result, or its ``key``."""
    item = results[index]
    return item if key is None else item[key]
