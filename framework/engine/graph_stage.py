"""A bare compute graph as a stage plugin: arrays in, arrays out, items stacked into one run.

Pipelines of plain graphs (the conformance graphs, a policy's ``graph:`` sources) need no
plugin of their own; the engine wraps each stage's graphs in :class:`GraphStage` so every stage
runs through the same contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.stage_plugin import GraphRunner, StagePlugin

__all__ = ["GraphStage"]

Arrays = dict[str, np.ndarray[Any, Any]]
MAIN = "main"


class GraphStage(StagePlugin):
    """One graph per variant (``light`` falls back to ``full``); a payload is the graph's
    input arrays, a result its output arrays."""

    batchable = True

    def __init__(self, name: str, variants: Mapping[str, ComputeGraph]) -> None:
        self.stage_name = name
        self.variants = dict(variants)

    @property
    def formats(self) -> tuple[GraphFormat, ...]:
        return (self.variants["full"].format,)

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        graph = self.variants.get(variant) or self.variants["full"]
        return {MAIN: graph}

    def items(self, payload: Any) -> int:
        for value in payload.values():
            if np.ndim(value):
                return int(np.shape(value)[0])
        return 1

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        """Stacked along axis 0 when every item's inputs allow it, else one run per item."""
        stacked = _stack(list(payloads)) if len(payloads) > 1 else None
        if stacked is not None:
            arrays, sizes = stacked
            return list(_split(runner.run(MAIN, arrays), sizes))
        return [runner.run(MAIN, payload) for payload in payloads]


def _stack(inputs: list[Arrays]) -> tuple[Arrays, list[int]] | None:
    """Concatenate items along axis 0 when every input of every item has at least one
    dimension, the same names, the same trailing shape and one leading size per item."""
    names = inputs[0].keys()
    if not names or any(item.keys() != names for item in inputs):
        return None
    if any(np.ndim(item[name]) == 0 for item in inputs for name in names):
        return None
    for name in names:
        if len({np.shape(item[name])[1:] for item in inputs}) != 1:
            return None
    sizes = [int(np.shape(item[next(iter(names))])[0]) for item in inputs]
    for name in names:
        if [int(np.shape(item[name])[0]) for item in inputs] != sizes:
            return None
    return {name: np.concatenate([item[name] for item in inputs]) for name in names}, sizes


def _split(outputs: Arrays, sizes: list[int]) -> list[Arrays]:
    total = sum(sizes)
    bounds = np.cumsum([0, *sizes])
    parts: list[Arrays] = [{} for _ in sizes]
    for name, value in outputs.items():
        array = np.asarray(value)
        for index in range(len(sizes)):
            if array.ndim and array.shape[0] == total:
                parts[index][name] = array[bounds[index] : bounds[index + 1]]
            else:
                parts[index][name] = array  # not batched along axis 0: every item sees it whole
    return parts
