"""The engine's two caches, as the request graph meets them: the feature cache (``features``,
content-keyed, looked up for a graph's first steps before admission, filled when a step ran)
and the stage output cache of bare graphs (``cache``, keyed by a step's input arrays)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hetero.framework.engine.graph_stage import GraphStage
from hetero.framework.engine.request_graph import RequestGraph
from hetero.framework.engine.requests import RequestState
from hetero.framework.scheduler import StageTask

if TYPE_CHECKING:
    from hetero.framework.engine.engine import Engine

__all__ = ["CacheFills"]

logger = logging.getLogger(__name__)


class CacheFills:
    """Lookups and fills of the engine's caches; a cache never fails a request."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def lookup(self, graph: RequestGraph) -> dict[str, tuple[Any, str]]:
        """Steps taking no other step's output (a first step, a large input's part) that the
        feature cache answers, by step: (value, tier)."""
        hits: dict[str, tuple[Any, str]] = {}
        if self.engine.features is None or graph.variant not in (None, "full"):
            return hits
        for step, node in graph.nodes.items():
            if node.cache_key is None or node.after:
                continue
            version = self.engine.policy.stages[node.stage].model_version
            try:
                value, tier = self.engine.features.lookup(
                    node.stage, node.cache_key("full", version)
                )
            except Exception as err:  # the cache never fails a request: a miss
                logger.warning("cache lookup for %s failed: %s", node.stage, err)
                continue
            if value is not None and tier is not None:
                hits[step] = (value, tier)
        return hits

    def _cache_identity(self, stage: str, variant: str) -> tuple[str, str, str, str | None]:
        config = self.engine.policy.stages[stage]
        return stage, config.model_version, variant, config.partition

    def cached(self, state: RequestState, step: str, stage: str, variant: str) -> Any:
        if self.engine.cache is None or not isinstance(self.engine.plugins.get(stage), GraphStage):
            return None
        try:
            inputs = self.engine._fetched(self.engine.runner.step_inputs(state, step))
            return self.engine.cache.get_outputs(*self._cache_identity(stage, variant), inputs)
        except Exception as err:  # the cache never fails a request: a miss
            logger.warning("cache lookup for %s failed: %s", stage, err)
            return None

    def offer(self, task: StageTask, inputs: Any, outputs: Any, key: Any = None) -> None:
        if key is not None and self.engine.features is not None:
            try:
                self.engine.features.put(task.stage, key, self.engine._fetched(outputs))
            except Exception as err:  # the cache never fails a request
                logger.warning("caching %s failed: %s", task.stage, err)
            return
        if self.engine.cache is None or not isinstance(self.engine.plugins[task.stage], GraphStage):
            return
        try:
            self.engine.cache.put_outputs(
                *self._cache_identity(task.stage, task.variant),
                self.engine._fetched(inputs),
                self.engine._fetched(outputs),
            )
        except Exception as err:
            logger.warning("caching %s failed: %s", task.stage, err)
