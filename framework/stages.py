"""Stages, pipelines (DAGs of stages) and requests."""

from __future__ import annotations

import enum
import itertools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from typing import Any

from pyrsistent import pmap

from hetero.framework.errors import CyclicPipelineError, PipelineError
from hetero.framework.graph import ComputeGraph

__all__ = ["Modality", "Pipeline", "PipelineStep", "Request", "Stage"]

FULL = "full"
LIGHT = "light"


class Modality(enum.StrEnum):
    """What kind of data a stage consumes."""

    TEXT = "text"
    IMAGE = "image"
    AUDIO = "audio"
    VIDEO = "video"
    EMBEDDING = "embedding"


@dataclass(frozen=True, slots=True)
class Stage:
    """One model step: a ``full`` graph, an optional cheaper ``light`` graph for degraded service.

    Attributes:
        name: Stage name as the policy spells it.
        modality: What it consumes.
        full: The graph used normally.
        light: The graph used when the complexity breaker degrades a request.
        partition: Data partition whose sandbox the stage must run in, if any.
    """

    name: str
    modality: Modality
    full: ComputeGraph
    light: ComputeGraph | None = None
    partition: str | None = None

    def variant(self, name: str) -> ComputeGraph:
        """The graph for variant ``name`` (``full`` or ``light``); light falls back to full."""
        if name == FULL:
            return self.full
        if name == LIGHT:
            return self.light or self.full
        raise KeyError(f"stage {self.name!r} has no variant {name!r}")


@dataclass(frozen=True, slots=True)
class PipelineStep:
    """A stage placed in a pipeline, with the steps whose output it needs."""

    stage: str
    after: tuple[str, ...] = ()
    waits: tuple[str, ...] = ()
    """Steps it starts after without taking their outputs (a large input's parts, so only a
    few of them are in flight at once)."""


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A DAG of steps, checked acyclic when built.

    Attributes:
        name: Pipeline name.
        steps: Step name to step; a step name is usually its stage name.
    """

    name: str
    steps: Mapping[str, PipelineStep]
    order: tuple[str, ...] = field(init=False)
    sinks: tuple[str, ...] = field(init=False, repr=False)
    """Steps whose outputs no other step takes: their outputs make the response."""
    after_of: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    """Each step's ``after`` as a plain dict (read-only): it is read for every step of every
    request, and a persistent map's lookup costs several times a dict's."""
    starts_after: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    """Each step's ``after`` and ``waits`` together: what must be done before it starts."""
    stage_of: dict[str, str] = field(init=False, repr=False, compare=False)
    """Each step's stage as a plain dict (read-only), read as often as ``after_of``."""

    def __post_init__(self) -> None:
        if not self.steps:
            raise PipelineError(f"pipeline {self.name!r} has no steps")
        starts_after = {name: step.after + step.waits for name, step in self.steps.items()}
        for step_name, deps in starts_after.items():
            for dep in deps:
                if dep not in self.steps:
                    raise PipelineError(
                        f"pipeline {self.name!r}: step {step_name!r} waits for unknown step {dep!r}"
                    )
        sorter = TopologicalSorter(starts_after)
        try:
            order = tuple(sorter.static_order())
        except CycleError as err:
            cycle = tuple(str(node) for node in err.args[1])
            raise CyclicPipelineError(self.name, cycle) from err
        object.__setattr__(self, "steps", pmap(self.steps))
        object.__setattr__(self, "order", order)
        object.__setattr__(
            self, "after_of", {name: step.after for name, step in self.steps.items()}
        )
        object.__setattr__(self, "starts_after", starts_after)
        object.__setattr__(
            self, "stage_of", {name: step.stage for name, step in self.steps.items()}
        )
        needed = {dep for step in self.steps.values() for dep in step.after}
        object.__setattr__(self, "sinks", tuple(name for name in order if name not in needed))

    @property
    def levels(self) -> tuple[tuple[str, ...], ...]:
        """Steps grouped by depth: each level may run in parallel once the previous is done."""
        depth: dict[str, int] = {}
        for name in self.order:
            after = self.steps[name].after
            depth[name] = 1 + max((depth[dep] for dep in after), default=-1)
        return tuple(
            tuple(name for name in self.order if depth[name] == level)
            for level in range(max(depth.values()) + 1)
        )

    def ready_steps(self, done: Collection[str], started: Collection[str]) -> list[str]:
        """Steps not yet started whose dependencies are all ``done``, in DAG order: the one
        readiness walk the engine and the simulator share."""
        after = self.starts_after
        return [
            name
            for name in self.order
            if name not in started and all(dep in done for dep in after[name])
        ]

    @property
    def sources(self) -> tuple[str, ...]:
        """Steps that wait for nothing."""
        return tuple(name for name in self.order if not self.steps[name].after)


_request_ids = itertools.count(1)


def _next_request_id() -> str:
    return f"req-{next(_request_ids)}"


@dataclass(frozen=True, slots=True)
class Request:
    """One unit of client work entering the engine.

    Attributes:
        route: The route that reached the engine (``/v1/image/describe``); picks the pipeline.
        payload: Inputs by name (text, image bytes, audio samples, ...).
        qos_class: QoS class name from the policy.
        principal: Who asks; access control and masking read it.
        arrival_time: When it arrived, on the engine's clock.
        id: Unique id, for logs and audit (never a metric label).
    """

    route: str
    payload: Mapping[str, Any]
    qos_class: str
    principal: str
    arrival_time: float
    id: str = field(default_factory=_next_request_id)
