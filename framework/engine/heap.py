"""The process heap: freed memory handed back to the operating system after a large request,
and the objects of start-up kept out of the garbage collector's full collections.

glibc keeps memory that Python, ONNX Runtime and the tokenizers freed in its arenas (one per
thread that allocated), so a single large request leaves the process hundreds of MB bigger
for good. ``malloc_trim(0)`` returns the free pages of every arena; elsewhere (musl, macOS)
there is nothing to call and this does nothing. Start-up frees much: warm-up compiles each stage
on every runtime that can run it, times it and releases all but the chosen copies. Trimmed
once the server is ready (:func:`freeze_long_lived`), the bench's two-model policy pinned to ONNX
Runtime sat idle at 333 MB instead of 364, pinned to OpenVINO at 423 instead of 486
(2026-12-07).

A server that has loaded its models holds 100,000-450,000 Python objects (the runtimes', the
tokenizers', the policy's: 116,000 for the bench policy pinned to ONNX Runtime, 436,000 unpinned,
with torch imported) that live as long as it does, and every full collection of the cyclic
garbage collector walks all of them: 65-75 ms with every thread stopped, about once every 10 s
at 100 requests a second (the pinned bench policy, measured with ``gc.callbacks``), which is
the p99 of a c=8 load. :func:`freeze_long_lived` moves what is alive
once the server is ready into the permanent generation (``gc.freeze``), so full collections
walk only what was made since. A frozen object that becomes cyclic garbage (a released model's)
is never collected, so :func:`collect_frozen` unfreezes, collects and freezes again whenever a
model is released (evicted; not when the server shuts down). The freeze's own collection takes
90-310 ms once, right after ``/ready`` turns 200.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import time
from collections.abc import Callable

__all__ = ["collect_frozen", "freeze_long_lived", "release_free_memory"]

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


def freeze_long_lived() -> int:
    """Collect, then keep every object alive now out of later collections (``gc.freeze``),
    and hand the pages freed since back to the OS (:func:`release_free_memory`): for a server
    once it is ready, and after a model is released. How many objects are frozen."""
    began = time.perf_counter()
    gc.unfreeze()  # what an earlier call froze and has since become garbage is collected too
    gc.collect()
    gc.freeze()
    release_free_memory()
    frozen = gc.get_freeze_count()
    logger.info("froze %d objects in %.0f ms", frozen, (time.perf_counter() - began) * 1000)
    return frozen


def collect_frozen() -> None:
    """After a model is released: if objects were frozen, collect them too (a released
    model's cyclic garbage among them) and freeze what is still alive; else nothing."""
    if gc.get_freeze_count():
        freeze_long_lived()
