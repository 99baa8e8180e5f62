"""Requests on a policy route whose stages are bare graphs (``Engine.submit(route, arrays)``):
the pipeline's first stage admitted, its arrays merged step to step by the graph runner."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import TYPE_CHECKING, Any

import numpy as np

from hetero.framework.engine.graph_runner import new_request_id
from hetero.framework.engine.requests import EngineResult, RequestState
from hetero.framework.errors import RequestTimeoutError, ShedError, UnknownRouteError
from hetero.framework.scheduler import RequestProfile
from hetero.framework.stages import Pipeline

if TYPE_CHECKING:
    from hetero.framework.engine.engine import Engine

__all__ = ["RouteRequests"]


class RouteRequests:
    """Starts and waits for requests on policy routes."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def submit(
        self,
        route: str,
        payload: Mapping[str, Any],
        *,
        qos_class: str | None = None,
        profile: RequestProfile | None = None,
        principal: Any = None,
    ) -> Future[EngineResult]:
        """Start a request on a policy route; its future holds the sink steps' outputs.
        Cancelling the future cancels the request.

        Raises:
            UnknownRouteError: the policy has no such route.
            PermissionError: a step touches a partition and the gate refused (or there is no
                gate); nothing was queued.
            ShedError: admission refused it (``status`` 429, ``retry_after_s``), or the engine
                is shutting down (503).
            KeyError: unknown QoS class.
        """
        spec = self.engine.policy.spec
        if route not in spec.routes:
            raise UnknownRouteError(route, tuple(sorted(spec.routes)))
        pipeline = self.engine.policy.pipeline_for_route(route)
        payload = {name: np.asarray(value) for name, value in payload.items()}
        return self._start_route(route, pipeline, payload, qos_class, profile, principal)

    def _start_route(
        self,
        route: str,
        pipeline: Pipeline,
        payload: Any,
        qos_class: str | None,
        profile: RequestProfile | None,
        principal: Any,
    ) -> Future[EngineResult]:
        qos = self.engine.admission.qos_class(qos_class)
        deadline_s = self.engine.admission.deadline_s(qos)
        request_id = new_request_id(None)
        self.engine.runner.authorize(pipeline, route, principal, request_id)
        if self.engine._stopping:
            raise ShedError("engine is shutting down", status=503)
        first = pipeline.stage_of[pipeline.order[0]]
        plugin = self.engine.plugins.get(first)
        items = plugin.items(payload) if plugin is not None else 1
        admitter = self.engine.admitter
        variant, _ = admitter.admit(first, qos, profile, items=items, principal=principal)
        now = self.engine.clock.now()
        future: Future[EngineResult] = Future()
        state = RequestState(
            request_id=request_id,
            route=route,
            pipeline=pipeline,
            payload=payload,
            qos_class=qos,
            variant=variant,
            arrival=now,
            deadline=now + deadline_s,
            future=future,
            units=self.engine.admitter.units(profile),
            principal=principal,
        )
        return self.engine.runner.start(state, (first,))

    def run(
        self,
        route: str,
        payload: Mapping[str, Any],
        *,
        timeout: float | None = None,
        qos_class: str | None = None,
        profile: RequestProfile | None = None,
    ) -> EngineResult:
        """Submit and wait; on timeout the request's remaining work is cancelled."""
        future = self.submit(route, payload, qos_class=qos_class, profile=profile)
        try:
            return future.result(timeout=timeout)
        except FutureTimeoutError:
            request_id = self._request_of(future)
            if request_id is not None and self.engine.runner.cancel(request_id):
                raise RequestTimeoutError(request_id, timeout or 0.0) from None
            return future.result()  # it finished while the timeout was being handled

    def _request_of(self, future: Future[EngineResult]) -> str | None:
        with self.engine._lock:
            return next(
                (rid for rid, s in self.engine._requests.items() if s.future is future), None
            )
