"""Start-up's objects kept out of full collections, and a released model's cyclic garbage
collected all the same (framework/engine/heap.py)."""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Iterator

import numpy as np
import pytest

from hetero.framework.engine.heap import collect_frozen, freeze_long_lived, release_free_memory


class _Model:
    """Stands in for a loaded model whose objects refer to each other (a cycle)."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test process collects as before


def _released_after_freeze() -> weakref.ref[_Model]:
    model = _Model()
    freeze_long_lived()
    ref = weakref.ref(model)
    del model  # released: now cyclic garbage among the frozen objects
    return ref


def test_objects_alive_when_ready_are_frozen_and_full_collections_skip_them() -> None:
    ref = _released_after_freeze()
    assert gc.get_freeze_count() > 0
    gc.collect()
    assert ref() is not None  # the control: frozen garbage survives a plain collection


def test_a_released_model_is_collected_once_its_release_says_so() -> None:
    ref = _released_after_freeze()
    collect_frozen()
    assert ref() is None
    assert gc.get_freeze_count() > 0  # what is still alive is frozen again


def test_collect_frozen_does_nothing_in_a_process_that_never_froze() -> None:
    gc.unfreeze()
    collect_frozen()
    assert gc.get_freeze_count() == 0


class _Backend:
    """Loads a graph as a model whose objects refer to each other (a runtime's session)."""

    def compile(self, graph: object, device_id: str) -> object:
        return graph

    def load(self, compiled: object) -> _Model:
        return _Model()

    def unload(self, model: _Model) -> None:
        pass


def test_evicting_a_model_from_a_device_collects_it_in_a_frozen_server() -> None:
    from typing import Any

    from hetero.framework.devices import DeviceSpec
    from hetero.framework.engine.device_models import DeviceModels
    from hetero.framework.graph import GraphFormat

    backend: Any = _Backend()
    device: Any = DeviceSpec.__new__(DeviceSpec)
    object.__setattr__(device, "id", "cpu:0")
    models = DeviceModels(backend, device)
    loaded, _ = models.get("mm/full", GraphFormat.ONNX, lambda: {"g": object()})
    ref = weakref.ref(loaded.models["g"])
    del loaded
    freeze_long_lived()  # the server is ready: the model is frozen with the rest
    models.evict("mm/full")
    assert ref() is None


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_memory_freed_before_the_server_is_ready_goes_back_to_the_os() -> None:
    """Warm-up frees much (copies timed and released); glibc keeps such pages in its
    arenas until they are trimmed, which readiness does."""
    if not release_free_memory():
        pytest.skip("no malloc_trim: not glibc")
    blocks = [np.ones(8_000) for _ in range(4_000)]  # 64 KB each: malloc's heap, not mmap
    kept = blocks[::50]  # live blocks between the freed ones keep the heap from shrinking
    del blocks
    gc.collect()
    held = _rss_bytes()
    freeze_long_lived()
    assert held - _rss_bytes() > 100 * 2**20  # of the 250 MB freed, most is returned
    del kept
