"""How many bytes a stage's output holds: one measure for the engine's transfer costs and for
what a Ray device actor answers inline or keeps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["nbytes_of"]


def nbytes_of(value: Any) -> int:
    """Bytes held by ``value``: arrays and tensors (anything with an integer ``nbytes``: numpy,
    torch, a remote stand-in), bytes and strings, and dicts, lists and tuples of them, summed;
    0 for what has no known size (numbers, None, other objects)."""
    if isinstance(value, bytes | bytearray | str):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    if isinstance(value, Mapping):
        return sum(nbytes_of(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(nbytes_of(v) for v in value)
    nbytes = getattr(value, "nbytes", None)
    return nbytes if isinstance(nbytes, int) and not isinstance(nbytes, bool) else 0
