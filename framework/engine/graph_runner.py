"""The request graph's way in: the model version of each stage, access checks, feature-cache
lookups before admission, registration, and each step's input (given, composed from its
dependencies' outputs, or a bare graph's arrays merged). Admission of every stage, fair shares
and the queueing of ready steps are the request walk's (:mod:`request_walk`), which the
simulator runs too."""

from __future__ import annotations

import functools
import itertools
import logging
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from hetero.framework.engine.graph_stage import GraphStage
from hetero.framework.engine.request_graph import GraphNode, RequestGraph
from hetero.framework.engine.request_walk import RequestWalk
from hetero.framework.engine.requests import EngineResult, RequestState
from hetero.framework.engine.status import (
    CACHE_DEVICE,
    AccessRefusedError,
)
from hetero.framework.engine.version_routing import Ticket, with_fallback
from hetero.framework.errors import (
    QueueFullError,
    ShedError,
    UnknownRouteError,
)
from hetero.framework.scheduler import (
    OutputHandle,
    RequestProfile,
    StageTask,
)
from hetero.framework.sizes import nbytes_of
from hetero.framework.stages import Pipeline, PipelineStep

if TYPE_CHECKING:
    from hetero.framework.engine.engine import Engine

__all__ = ["GraphRunner"]

logger = logging.getLogger(__name__)
_request_ids = itertools.count(1)

# Graph shapes whose checked DAG is kept: a route sends the same few shapes again and again (a
# split request one per part count), and a shape's check is a topological sort.
SHAPES_KEPT = 512
Shape = tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...]


def new_request_id(caller_id: str | None) -> str:
    """The engine's id of a new request: the caller's (the HTTP request's) extended, or its
    own."""
    number = next(_request_ids)
    return f"{caller_id}:{number}" if caller_id else f"req-{number}"


def on_versions(graph: RequestGraph, tickets: dict[str, Ticket]) -> RequestGraph:
    """``graph`` with each step's stage the engine stage its ticket chose (the same graph when
    every stage is served by itself)."""
    if all(t.engine_stage == stage for stage, t in tickets.items()):
        return graph
    nodes = {
        step: replace(node, stage=tickets[node.stage].engine_stage)
        for step, node in graph.nodes.items()
    }
    return replace(graph, nodes=nodes)


@functools.lru_cache(maxsize=SHAPES_KEPT)
def _checked(name: str, shape: Shape) -> Pipeline:
    """The checked DAG of a graph of this ``shape`` (each step's name, stage, ``after`` and
    ``waits``), made once per shape. Checked per request, a three-step echo graph took 460-550
    us of CPU through the engine, against 400-420 checked once (the engine bench's graphs,
    :func:`hetero.framework.bench.engine.engine_overhead`). A shape that fails its check
    raises each time (errors are not kept)."""
    steps = {step: PipelineStep(stage, after, waits) for step, stage, after, waits in shape}
    return Pipeline(name, steps)


class GraphRunner:
    """Starts requests and queues their steps as they become ready."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # admission asked through the engine's admitter (its lock, its metrics)
        self.walk = RequestWalk(engine.admission, engine.scheduler, engine.plugins, self._admit)

    def _admit(
        self,
        stage: str,
        qos_class: str | None,
        profile: RequestProfile | None,
        *,
        items: int = 1,
        principal: Any = None,
        sequence: StageTask | None = None,
    ) -> tuple[str, str]:
        return self.engine.admitter.admit(
            stage, qos_class, profile, items=items, principal=principal, sequence=sequence
        )

    def submit_stage(
        self,
        stage: str,
        payload: Any,
        *,
        qos_class: str | None = None,
        profile: RequestProfile | None = None,
        principal: Any = None,
        variant: str | None = None,
        request_id: str | None = None,
    ) -> Future[EngineResult]:
        """Run one stage on one payload (what its plugin takes); the future's
        ``outputs[stage]`` is the plugin's result and ``devices[stage]`` where it ran.
        ``variant`` skips admission's choice (the caller already chose); ``request_id`` (the
        caller's, e.g. the HTTP request's) prefixes the engine's id, which the access gate
        records. A one-step :meth:`submit_graph`."""
        if stage not in self.engine.plugins:
            raise UnknownRouteError(stage, tuple(sorted(self.engine.plugins)))
        if profile is None:  # the plugin measures it, cheaply (its pace is kept per unit)
            profile = self.engine.admitter.profile(stage, payload)
        node = GraphNode(stage, payload=payload, profile=profile)
        graph = RequestGraph(
            stage,
            {stage: node},
            qos_class=qos_class,
            principal=principal,
            request_id=request_id,
            variant=variant,
        )
        return self.submit_graph(graph)

    def submit_graph(self, graph: RequestGraph) -> Future[EngineResult]:
        """Start a request graph; its future holds the outputs of the steps marked
        ``answer`` (masked for the principal where a stage touches a partition), where each
        step ran, on which model version, and which the feature cache answered. Cancelling
        the future cancels the request.

        In order: each stage's model version (:mod:`version_routing`: the one serving it, or
        a canary's); access checks for every step that touches a partition; the feature
        cache for first steps with a key (a request answered whole by the cache is never
        queued); admission of every other step (its variant, the class's deadline behind the
        queue, the principal's fair share of each stage); then every step whose inputs are
        ready is queued, the others as their dependencies finish. A request that fails on a
        canary's version is answered again on the serving ones (``graph.falls_back``).

        Raises:
            UnknownRouteError: a step names a stage the engine does not run.
            PermissionError: a step touches a partition and the gate refused; nothing queued.
            ShedError: admission refused it (429 with ``retry_after_s``) or the engine is
                shutting down (503).
            KeyError: unknown QoS class.
        """
        routing = self.engine.routing
        tickets = routing.pick(node.stage for node in graph.nodes.values())
        try:
            first = self._start_graph(on_versions(graph, tickets))
        except BaseException:
            routing.close(tickets, answered=False)  # refused or shed: nothing ran
            raise

        def again(retry: dict[str, Ticket]) -> Future[EngineResult]:
            return self._start_graph(on_versions(graph, retry))

        return with_fallback(routing, tickets, first, again if graph.falls_back else None)

    def _start_graph(self, graph: RequestGraph) -> Future[EngineResult]:
        """:meth:`submit_graph` of a graph whose steps name engine stages."""
        engine = self.engine
        nodes = graph.nodes
        plugins = engine.plugins
        for node in nodes.values():
            if node.stage not in plugins:
                raise UnknownRouteError(node.stage, tuple(sorted(plugins)))
        pipeline = self._pipeline_of(graph)
        qos = engine.admission.qos_class(graph.qos_class)
        deadline_s = engine.admission.deadline_s(qos)
        request_id = new_request_id(graph.request_id)
        principal = graph.principal
        self.authorize(pipeline, graph.name, principal, request_id)
        if engine._stopping:
            raise ShedError("engine is shutting down", status=503)
        hits = self.engine.fills.lookup(graph)
        state = RequestState(
            request_id=request_id,
            route=graph.name,
            pipeline=pipeline,
            payload=None,
            qos_class=qos,
            variant=graph.variant or "full",
            arrival=0.0,
            deadline=0.0,
            future=Future(),
            principal=principal,
        )
        self.walk.begin(state, nodes, skip=hits, variant=graph.variant)
        for step, (value, tier) in hits.items():
            state.outputs[step] = OutputHandle(CACHE_DEVICE, value, nbytes_of(value))
            state.devices[step] = CACHE_DEVICE
            state.cached[step] = tier
        if engine.features is not None:
            stages = engine.policy.stages
            for step, variant in state.variants.items():
                node = nodes[step]
                if node.cache_key is not None:
                    state.keys[step] = node.cache_key(variant, stages[node.stage].model_version)
        state.arrival = now = engine.clock.now()
        state.deadline = now + deadline_s
        return self.start(state)

    def _pipeline_of(self, graph: RequestGraph) -> Pipeline:
        """The graph's steps as a checked DAG, checked once per shape (:func:`_checked`)."""
        shape = tuple(
            (step, node.stage, tuple(node.after), tuple(node.waits))
            for step, node in graph.nodes.items()
        )
        return _checked(graph.name, shape)

    def start(
        self, state: RequestState, shares: tuple[str, ...] | None = None
    ) -> Future[EngineResult]:
        """Register a request and queue its ready steps; answered at once when nothing is
        left to run. The principal holds a share of each stage in ``shares`` (by default of
        every stage admission judged) until the request ends."""
        future = state.future
        with self.engine._lock:
            if self.engine._stopping:
                raise ShedError("engine is shutting down", status=503)
            self.engine._requests[state.request_id] = state
            self.engine.scheduler.requests_live = len(self.engine._requests)
            self.walk.hold(state, shares)
            try:
                self.enqueue_ready(state)
            except BaseException as err:  # shed, or a step's input refused: it ends here,
                self.end(state)  # its queued steps dropped and its shares given back
                if not isinstance(err, ShedError):
                    raise
                stage = state.pipeline.stage_of[state.pipeline.order[0]]
                self.engine.metrics.shed.labels(stage, "queue_full").inc()
                self.engine.metrics.outcomes.labels(state.route, "shed").inc()
                if isinstance(err, QueueFullError):
                    err.retry_after_s = max(
                        self.engine.policy.spec.server.retry_after_s,
                        self.engine.admitter.queue_delay_s(stage),
                    )
                raise
            answered = state.done()  # every step came from the cache
            if answered:
                self.end(state)
        if answered:
            self.engine.metrics.outcomes.labels(state.route, "ok").inc()
            future.set_result(self.engine.outcomes.result(state))
            return future
        future.add_done_callback(lambda done: self._caller_cancelled(done, state.request_id))
        self.engine.dispatcher.kick()
        return future

    def authorize(self, pipeline: Pipeline, route: str, principal: Any, request_id: str) -> None:
        for step in pipeline.order:
            stage = pipeline.stage_of[step]
            partition = self.engine.policy.stages[stage].partition
            if partition is None:
                continue
            if self.engine.gate is None:
                raise AccessRefusedError(
                    f"route {route}: stage {stage!r} touches partition {partition!r} and this "
                    "engine has no compliance gate"
                )
            self.engine.gate.authorize(principal, stage, request_id)

    def cancel(self, request_id: str) -> bool:
        """Cancel a request: queued steps are dropped, running ones finish and are ignored."""
        with self.engine._lock:
            state = self.engine._requests.get(request_id)
            if state is None:
                return False
            self.end(state)
        state.future.cancel()
        self.engine.metrics.outcomes.labels(state.route, "cancelled").inc()
        return True

    def _caller_cancelled(self, future: Future[EngineResult], request_id: str) -> None:
        if future.cancelled():
            self.cancel(request_id)

    def end(self, state: RequestState) -> None:
        """Forget a request that ended and drop its queued steps (lock held)."""
        self.engine._requests.pop(state.request_id, None)
        self.engine.scheduler.requests_live = len(self.engine._requests)
        self.walk.end(state)

    def enqueue_ready(self, state: RequestState) -> None:
        """Queue every step whose inputs are ready, answering from the cache where it can
        (lock held)."""
        self.walk.enqueue_ready(state, self.step_inputs, self._cached)

    def _cached(self, state: RequestState, step: str, stage: str, variant: str) -> bool:
        """A step the feature cache answers: its output kept as the cache's."""
        cached = self.engine.fills.cached(state, step, stage, variant)
        if cached is None:
            return False
        size = sum(int(np.asarray(v).nbytes) for v in cached.values())
        state.outputs[step] = OutputHandle(CACHE_DEVICE, cached, size)
        state.devices[step] = CACHE_DEVICE
        return True

    def step_inputs(self, state: RequestState, step: str) -> Any:
        """A step's payload: the request's for a first step; for a bare graph after others,
        its dependencies' output arrays merged and filtered to the graph's input names; for a
        plugin after others, the dependencies' outputs by step."""
        if step in state.payloads:
            return state.payloads[step]
        compose = state.composers.pop(step, None)
        if compose is not None:  # once, when its dependencies are done
            done = {
                dep: self.engine._fetched(state.outputs[dep].value)
                for dep in state.pipeline.after_of[step]
            }
            state.payloads[step] = compose(done)
            return state.payloads[step]
        deps = state.pipeline.after_of[step]
        payload = {dep: state.outputs[dep].value for dep in deps} if deps else state.payload
        plugin = self.engine.plugins.get(state.pipeline.stage_of[step])
        if not isinstance(plugin, GraphStage):
            return payload
        arrays: dict[str, Any] = dict(payload) if not deps else {}
        for dep in deps:
            arrays.update(state.outputs[dep].value)
        names = plugin.graphs(state.variant)["main"].input_names
        return {n: arrays[n] for n in names if n in arrays} if names else arrays
