"""Handing freed heap memory back to the operating system after a large request.

glibc keeps memory that Python, ONNX Runtime and the tokenizers freed in its arenas (one per
thread that allocated), so a single large request leaves the process hundreds of MB bigger
for good. ``malloc_trim(0)`` returns the free pages of every arena; elsewhere (musl, macOS)
there is nothing to call and this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

__all__ = ["release_free_memory"]

logger = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


def release_free_memory() -> bool:
    """Return the allocator's free pages to the OS; whether there was a way to."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
