"""A request as the engine runs it: a graph of steps, each a stage with its input, the input's
profile measured once, and how its output is looked up in and filled into the feature cache.

A route builds one :class:`RequestGraph` per request (a single stage is a one-node graph) and
submits it once with :meth:`~hetero.framework.engine.Engine.submit_graph`; the engine does the
rest: cache lookups before admission, admission of every step against the request's class,
placement, the steps whose inputs are ready run at once (in parallel where the graph allows),
fills, masking for the caller, and the outputs the caller asked for fetched to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from hetero.framework.scheduler.breakers import RequestProfile

__all__ = ["FeatureStore", "GraphNode", "RequestGraph"]


class FeatureStore(Protocol):
    """The feature cache as the engine asks it (``hetero.cache.FeatureCache`` behind an
    adapter that knows each stage's value codec). A store never fails a request: a lookup
    that cannot be answered is a miss."""

    def lookup(self, stage: str, key: Any) -> tuple[Any, str | None]:
        """(value, tier that had it), or (None, None) on a miss."""
        ...

    def put(self, stage: str, key: Any, value: Any) -> None:
        """Keep ``value`` under ``key`` (write-through to every tier)."""
        ...


@dataclass(slots=True)
class GraphNode:
    """One step of a request.

    Attributes:
        stage: The stage (the engine picks the model version serving it: the stage itself,
            or a swapped-in version's engine stage, ``version_routing``).
        after: Steps whose outputs it needs.
        waits: Steps it starts after without taking their outputs: the parts of one large
            input, each waiting for the part some places before it, so only a few are in
            flight at once (other requests run between them).
        payload: What its plugin takes, when known at submit (a first step's input).
        compose: Builds its payload from its dependencies' outputs (by step name) when they
            are done; called once, on the engine's thread: keep it cheap (no I/O).
        profile: The plugin's measure of its input (tokens, pixels, seconds), computed once by
            whoever read the input; admission and placement both see this one.
        items: Inputs it holds (a batch of texts); by default the plugin counts them.
        cache_key: Its feature-cache key for a variant and the model version the engine
            chose (``None``: not cached). A first step with a key is looked up before
            admission: a hit costs no queueing.
        answer: Whether the caller gets its output (the others stay where they were made
            until the step that needs them takes them).
    """

    stage: str
    after: tuple[str, ...] = ()
    payload: Any = None
    compose: Callable[[Mapping[str, Any]], Any] | None = None
    profile: RequestProfile | None = None
    items: int | None = None
    cache_key: Callable[[str, str], Any] | None = None
    answer: bool = True
    waits: tuple[str, ...] = ()


@dataclass(slots=True)
class RequestGraph:
    """A request: its steps by name, and who asks.

    Attributes:
        name: What metrics and errors call it (the route or pipeline).
        nodes: Steps by name, in any order (the engine sorts them; a cycle is refused).
        qos_class: Its QoS class (the policy's default when None).
        principal: Who asks (access checks, fair shares, masking).
        request_id: The caller's id (the HTTP request's); the engine's id extends it.
        variant: Run every step on this variant, skipping admission's choice.
        falls_back: A request that failed on a canary's model version is answered again on
            the serving versions (False for one whose output already streamed: the failure
            is counted, not run again).
    """

    name: str
    nodes: dict[str, GraphNode] = field(default_factory=dict)
    qos_class: str | None = None
    principal: Any = None
    request_id: str | None = None
    variant: str | None = None
    falls_back: bool = True
