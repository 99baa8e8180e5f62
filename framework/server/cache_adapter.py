"""The feature cache as the engine asks it (:class:`~hetero.framework.engine.FeatureStore`):
each stage kind's values converted to what the cache stores and back, hits and misses counted
per policy stage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from hetero.cache.feature_cache import FeatureCache

if TYPE_CHECKING:
    from hetero.framework.server.serving import Serving

__all__ = ["CACHED_KINDS", "CacheAdapter"]

CACHED_KINDS = frozenset({"vision_encode", "ocr", "asr", "text_embed"})


class CacheAdapter:
    """The feature cache as the engine asks it: values converted per stage kind, hits and
    misses counted per policy stage."""

    def __init__(self, serving: Serving, cache: FeatureCache) -> None:
        self.serving = serving
        self.cache = cache

    def _kind(self, stage: str) -> str:
        engine = self.serving.engine
        plugin = engine.plugins.get(stage) if engine is not None else None
        return str(getattr(plugin, "name", ""))

    def lookup(self, stage: str, key: Any) -> tuple[Any, str | None]:
        hit, tier = self.cache.lookup(key)
        name = stage.split("@", 1)[0]  # a swapped-in version's engine stage: name@version
        if hit is None:
            self.serving.metrics.cache_misses.labels(name).inc()
            return None, None
        self.serving.metrics.cache_hits.labels(name).inc()
        return _from_cache(self._kind(stage), hit), tier

    def put(self, stage: str, key: Any, value: Any) -> None:
        self.cache.put(key, value)


def _from_cache(kind: str, value: Any) -> Any:
    """A vision result as the stage returns it, in a dict of its own (the memory tier's is
    shared by every hit): its embedding a float32 array, also for entries stored before the
    codec kept arrays beside JSON (a list of floats then)."""
    if kind == "vision_encode" and isinstance(value, dict):
        embedding = value.get("embedding")
        if isinstance(embedding, list):
            return {**value, "embedding": np.asarray(embedding, dtype=np.float32)}
        return dict(value)
    return value
