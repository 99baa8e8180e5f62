"""Values that live where they were made: a stage's output held on another node.

A cluster backend runs a stage on a node and leaves its outputs there (in the Ray device actor
that made them);
the engine passes the stand-ins below to the next stage, whose node reads them where they lie
(locally when it is the same node), and fetches them only where it needs their content: a
request's final outputs and the feature cache. The engine knows nothing of how a value is kept.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

__all__ = ["RemoteValue", "materialize"]


class RemoteValue(abc.ABC):
    """A stand-in for a value kept elsewhere: its size and shape are known here, its content
    is fetched on :meth:`fetch`."""

    nbytes: int = 0
    shape: tuple[int, ...] = ()

    @property
    def ndim(self) -> int:
        """Dimensions of the array it stands for (0 for anything else)."""
        return len(self.shape)

    @abc.abstractmethod
    def fetch(self) -> Any:
        """The value itself, brought to this process."""


def materialize(value: Any) -> Any:
    """``value`` with every :class:`RemoteValue` in it (in dicts, lists, tuples) fetched."""
    if isinstance(value, RemoteValue):
        return materialize(value.fetch())
    if isinstance(value, Mapping):
        return {key: materialize(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        items = [materialize(item) for item in value]
        if hasattr(value, "_fields"):  # a named tuple takes its fields as arguments
            return type(value)(*items)
        return type(value)(items)
    return value
