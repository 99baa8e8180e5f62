"""The engine: runs pipelines for real on the available backends.

It strings the parts together and nothing else: admission (the complexity breaker), the
scheduler (queues, placement, memory, failure breakers), one :class:`DeviceWorker` per device,
and futures for callers. A device that raises, or runs out of memory, gets its breaker
informed and the task retried on another device; a request fails only when no device is left
to try, and then with every device's failure in the error. No request is lost silently.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Mapping
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, Protocol

import numpy as np

from hetero.framework.backend import Backend
from hetero.framework.engine.metrics import EngineMetrics
from hetero.framework.engine.requests import EngineResult, RequestState
from hetero.framework.engine.worker import BatchOutcome, DeviceWorker
from hetero.framework.errors import (
    HeteroError,
    NoEligibleDeviceError,
    RequestTimeoutError,
    ShedError,
    UnknownRouteError,
)
from hetero.framework.fleet import Fleet, resolve_fleet
from hetero.framework.graph import ComputeGraph
from hetero.framework.policy import Policy
from hetero.framework.registry import Registry
from hetero.framework.scheduler import (
    Admission,
    BreakerState,
    ComplexityBreaker,
    Dispatch,
    OutputHandle,
    Rejection,
    RequestProfile,
    Scheduler,
    StageTask,
    WallClock,
)
from hetero.framework.stage_cache import StageCache

__all__ = ["AccessGate", "AccessRefusedError", "Engine"]


class AccessGate(Protocol):
    """Decides whether a principal may run a stage that touches a partition (and records the
    decision); raises a ``PermissionError`` to refuse. ``hetero.sandbox.gate.ComplianceGate``
    is the implementation."""

    def authorize(self, principal: Any, stage: str, request_id: str) -> None:
        """Return to allow; raise to refuse."""
        ...


class AccessRefusedError(HeteroError, PermissionError):
    """A request reaches a partition the engine may not touch."""


logger = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray[Any, Any]]
DISPATCH_POLL_S = 0.05
CACHE_DEVICE = "cache"  # where a cached output "lives": the host, for transfer costs
_request_ids = itertools.count(1)


class Engine:
    """Pipelines on real devices. Use as a context manager, or call :meth:`start` / :meth:`close`.

    Args:
        policy: The policy snapshot.
        registry: Where backends come from.
        graphs: The graph of each stage variant, keyed ``stage/variant`` (a missing ``light``
            falls back to ``full``). A step receives its dependencies' outputs merged (or the
            request payload, for a first step), filtered to the graph's ``input_names`` if set.
        fleet: Devices to use (default: the policy's fleet on this host).
        placement: Override the policy's placement policy.
        cache: Stage outputs by input content (``hetero.cache.StageOutputCache``): a step whose
            inputs were seen before skips its device; a computed step is offered to it.
        gate: Access decisions for stages with a partition
            (``hetero.sandbox.gate.ComplianceGate``), asked for every such step before the
            request is queued; its refusal is raised from :meth:`submit`. Without a gate, a
            route that reaches a partition is refused: sensitive data is never run unchecked.
    """

    def __init__(
        self,
        policy: Policy,
        registry: Registry,
        graphs: Mapping[str, ComputeGraph],
        *,
        fleet: Fleet | None = None,
        placement: str | None = None,
        cache: StageCache | None = None,
        gate: AccessGate | None = None,
    ) -> None:
        self.policy = policy
        self.cache = cache
        self.gate = gate
        self.graphs = dict(graphs)
        self.fleet = fleet or resolve_fleet(policy, registry)
        self.clock = WallClock()
        self.metrics = EngineMetrics()
        self.backends: dict[str, Backend] = {}
        for device in self.fleet.devices:
            if device.backend not in self.backends:
                self.backends[device.backend] = registry.backend(device.backend)
        self._device_by_id = {d.id: d for d in self.fleet.devices}
        self.scheduler = Scheduler(
            policy,
            self.fleet.devices,
            self.fleet.topology(),
            self.clock,
            placement=placement,
            can_run=self._can_run,
            outputs_on_host=True,
        )
        self.admission = ComplexityBreaker(policy.spec.circuit_breaker.complexity)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._requests: dict[str, RequestState] = {}
        self.workers = {
            d.id: DeviceWorker(
                d,
                self.backends[d.backend],
                self._graph,
                self._inputs,
                self.scheduler.batching_for,
                self._on_batch,
            )
            for d in self.fleet.devices
        }
        self._dispatcher = threading.Thread(
            target=self._dispatch_loop, name="hetero-dispatch", daemon=True
        )
        self._started = False

    # --- set-up ------------------------------------------------------------------------------

    def _graph(self, model_key: str) -> ComputeGraph:
        if model_key in self.graphs:
            return self.graphs[model_key]
        return self.graphs[model_key.split("/", 1)[0] + "/full"]

    def _can_run(self, stage: str, variant: str, device_id: str) -> bool:
        graph = self.graphs.get(f"{stage}/{variant}") or self.graphs.get(f"{stage}/full")
        if graph is None:
            return False
        backend = self.backends[self._device_by_id[device_id].backend]
        return backend.accepts(graph.format, device_id)

    def start(self) -> Engine:
        """Start the dispatcher and one worker per device."""
        if not self._started:
            for worker in self.workers.values():
                worker.start()
            self._dispatcher.start()
            self._started = True
        return self

    def close(self) -> None:
        """Stop accepting work, fail what is still queued, stop the workers, unload models."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        if self._started:
            self._dispatcher.join()
            for worker in self.workers.values():
                worker.stop()
        with self._lock:
            pending = list(self._requests.values())
            for state in pending:
                self._end(state)
        for state in pending:
            _settle(state.future, error=ShedError("engine is shutting down", status=503))

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- requests ----------------------------------------------------------------------------

    def submit(
        self,
        route: str,
        payload: Mapping[str, Any],
        *,
        qos_class: str | None = None,
        profile: RequestProfile | None = None,
        principal: Any = None,
    ) -> Future[EngineResult]:
        """Start a request; its future holds the sink steps' outputs. Cancelling the future
        cancels the request. ``principal`` (``hetero.sandbox.Principal``) is who asks; the
        gate decides on it for every step that touches a partition.

        Raises:
            UnknownRouteError: the policy has no such route.
            PermissionError: a step touches a partition and the gate refused (or there is no
                gate); nothing was queued.
            ShedError: admission refused it (``status`` 429, ``retry_after_s``), or the engine
                is shutting down (503).
            KeyError: unknown QoS class.
        """
        spec = self.policy.spec
        if route not in spec.routes:
            raise UnknownRouteError(route, tuple(sorted(spec.routes)))
        qos = qos_class or spec.qos.default_class
        if qos not in spec.qos.classes:
            classes = ", ".join(sorted(spec.qos.classes))
            raise KeyError(f"unknown QoS class {qos!r} (classes: {classes})")
        deadline_s = spec.sla_tiers[spec.qos.classes[qos].sla_tier].deadline_ms / 1000.0
        request_id = f"req-{next(_request_ids)}"
        self._authorize(route, principal, request_id)
        variant = "full"
        with self._lock:
            if self._stopping:
                raise ShedError("engine is shutting down", status=503)
            # Only requests that state a profile are judged, and only they shape the p95.
            decision = (
                None
                if profile is None
                else self.admission.decide(profile, self.scheduler.queue_delay_s(), deadline_s)
            )
        if decision is not None and decision.action is Admission.SHED:
            self.metrics.sheds.labels("complexity").inc()
            self.metrics.requests.labels(route, "shed").inc()
            raise ShedError(decision.reason, status=429, retry_after_s=decision.retry_after_s)
        if decision is not None and decision.action is Admission.DEGRADE:
            variant = "light"
            self.metrics.degraded.inc()
        now = self.clock.now()
        future: Future[EngineResult] = Future()
        state = RequestState(
            request_id=request_id,
            route=route,
            pipeline=self.policy.pipeline_for_route(route),
            payload={name: np.asarray(value) for name, value in payload.items()},
            qos_class=qos,
            variant=variant,
            arrival=now,
            deadline=now + deadline_s,
            future=future,
        )
        with self._lock:
            self._requests[state.request_id] = state
            try:
                self._enqueue_ready(state)
            except ShedError:
                self._end(state)
                self.metrics.sheds.labels("queue_full").inc()
                self.metrics.requests.labels(route, "shed").inc()
                raise
            answered = state.done()  # every step came from the cache
            if answered:
                self._end(state)
        if answered:
            self.metrics.requests.labels(route, "ok").inc()
            future.set_result(self._result(state))
            return future
        future.add_done_callback(lambda done: self._caller_cancelled(done, state.request_id))
        self._wake.set()
        return future

    def _authorize(self, route: str, principal: Any, request_id: str) -> None:
        pipeline = self.policy.pipeline_for_route(route)
        for step in pipeline.order:
            stage = pipeline.steps[step].stage
            partition = self.policy.spec.stages[stage].partition
            if partition is None:
                continue
            if self.gate is None:
                raise AccessRefusedError(
                    f"route {route}: stage {stage!r} touches partition {partition!r} and this "
                    "engine has no compliance gate"
                )
            self.gate.authorize(principal, stage, request_id)

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
            if request_id is not None and self.cancel(request_id):
                raise RequestTimeoutError(request_id, timeout or 0.0) from None
            return future.result()  # it finished while the timeout was being handled

    def _request_of(self, future: Future[EngineResult]) -> str | None:
        with self._lock:
            return next((rid for rid, s in self._requests.items() if s.future is future), None)

    def cancel(self, request_id: str) -> bool:
        """Cancel a request: queued steps are dropped, running ones finish and are ignored."""
        with self._lock:
            state = self._requests.get(request_id)
            if state is None:
                return False
            self._end(state)
        state.future.cancel()
        self.metrics.requests.labels(state.route, "cancelled").inc()
        return True

    def _caller_cancelled(self, future: Future[EngineResult], request_id: str) -> None:
        if future.cancelled():
            self.cancel(request_id)

    def _end(self, state: RequestState) -> None:
        """Forget a request that ended and drop its queued steps (lock held)."""
        self._requests.pop(state.request_id, None)
        for task in state.live_tasks.values():
            self.scheduler.cancel(task)
        state.live_tasks.clear()

    # --- the loop ----------------------------------------------------------------------------

    def _enqueue_ready(self, state: RequestState) -> None:
        """Queue every step whose inputs are ready, answering from the cache where it can
        (lock held)."""
        now = self.clock.now()
        stages = self.policy.spec.stages
        progressed = True
        while progressed:  # a cached step can make the next one ready at once
            progressed = False
            for step in state.ready_steps():
                stage = state.pipeline.steps[step].stage
                variant = state.variant if state.variant in stages[stage].variants else "full"
                cached = self._cached(state, step, stage, variant)
                if cached is not None:
                    size = sum(int(np.asarray(v).nbytes) for v in cached.values())
                    state.outputs[step] = OutputHandle(CACHE_DEVICE, cached, size)
                    state.devices[step] = CACHE_DEVICE
                    progressed = True
                    continue
                task = StageTask(
                    request_id=state.request_id,
                    stage=stage,
                    step=step,
                    variant=variant,
                    qos_class=state.qos_class,
                    arrival=state.arrival,
                    deadline=state.deadline,
                    inputs=tuple(state.outputs[dep] for dep in state.pipeline.steps[step].after),
                    items=_items(state.payload),
                    enqueued_at=now,
                )
                self.scheduler.enqueue(task)
                state.live_tasks[task.id] = task

    def _step_inputs(self, state: RequestState, step: str, model_key: str) -> Arrays:
        """A step's input arrays: the payload for a first step, else its dependencies' outputs
        merged, filtered to the graph's input names when it has them."""
        deps = state.pipeline.steps[step].after
        arrays: Arrays = {}
        if not deps:
            arrays = dict(state.payload)
        for dep in deps:
            arrays.update(state.outputs[dep].value)
        names = self._graph(model_key).input_names
        return {n: arrays[n] for n in names if n in arrays} if names else arrays

    def _cache_identity(self, stage: str, variant: str) -> tuple[str, str, str, str | None]:
        config = self.policy.spec.stages[stage]
        return stage, config.model_version, variant, config.partition

    def _cached(
        self, state: RequestState, step: str, stage: str, variant: str
    ) -> dict[str, np.ndarray[Any, Any]] | None:
        if self.cache is None or f"{stage}/{variant}" not in self.scheduler.tables:
            return None
        try:
            inputs = self._step_inputs(state, step, f"{stage}/{variant}")
            return self.cache.get_outputs(*self._cache_identity(stage, variant), inputs)
        except Exception as err:  # the cache never fails a request: a miss
            logger.warning("cache lookup for %s failed: %s", stage, err)
            return None

    def _offer(self, task: StageTask, inputs: Arrays, outputs: Arrays) -> None:
        if self.cache is None:
            return
        try:
            self.cache.put_outputs(*self._cache_identity(task.stage, task.variant), inputs, outputs)
        except Exception as err:
            logger.warning("caching %s failed: %s", task.stage, err)

    def _dispatch_loop(self) -> None:
        while not self._stopping:
            self._wake.wait(timeout=DISPATCH_POLL_S)
            self._wake.clear()
            try:
                self._dispatch_ready()
            except Exception:  # a bug here must not stop dispatching for everyone
                logger.exception("dispatch failed unexpectedly")

    def _dispatch_ready(self) -> None:
        outcomes: list[Dispatch | Rejection] = []
        with self._lock:
            while (outcome := self.scheduler.dispatch()) is not None:
                outcomes.append(outcome)
        for outcome in outcomes:
            if isinstance(outcome, Rejection):
                self._fail(outcome.task.request_id, outcome.error)
                continue
            if outcome.load.load:
                self.metrics.loads.labels(outcome.device_id).inc()
            if outcome.load.evict:
                self.metrics.evictions.labels(outcome.device_id).inc(len(outcome.load.evict))
            self.workers[outcome.device_id].inbox.put(outcome)

    def _inputs(self, dispatch: Dispatch) -> Arrays | None:
        """A task's input arrays; None when its request is gone (cancelled, timed out)."""
        task = dispatch.task
        with self._lock:
            state = self._requests.get(task.request_id)
            if state is None or task.cancelled:
                return None
            return self._step_inputs(state, task.step, dispatch.model_key)

    def _on_batch(self, outcomes: list[BatchOutcome]) -> None:
        self._sync_health()
        self._observe_batch([o for o in outcomes if o.error is None and not o.skipped])
        for outcome in outcomes:
            self._finish(outcome)
        self._wake.set()

    def _observe_batch(self, ran: list[BatchOutcome]) -> None:
        if not ran:
            return
        first = ran[0]
        device = self._device_by_id[first.dispatch.device_id]
        stage = first.dispatch.task.stage
        if first.batch_size > 1:  # one stacked run
            self.metrics.batch_size.labels(stage).observe(first.batch_size)
            busy = first.run_s
        else:  # items that could not be stacked ran one by one
            for _ in ran:
                self.metrics.batch_size.labels(stage).observe(1)
            busy = sum(o.run_s for o in ran)
        self.metrics.stage_latency.labels(stage, device.device_class.value).observe(busy)
        self.metrics.device_busy.labels(device.id).inc(busy)

    def _sync_health(self) -> None:
        """Devices their backend marked unhealthy (or healthy again) leave (or rejoin)
        placement; checked after every batch, so a fault seen anywhere applies at once."""
        with self._lock:
            for index, device in enumerate(self.fleet.devices):
                healthy = self.backends[device.backend].health(device.id) is None
                if bool(self.scheduler.healthy[index]) != healthy:
                    self.scheduler.set_health(device.id, healthy)

    def _finish(self, outcome: BatchOutcome) -> None:
        dispatch = outcome.dispatch
        task = dispatch.task
        device = self._device_by_id[dispatch.device_id]
        if outcome.skipped:
            with self._lock:
                self.scheduler.completed(dispatch, ok=True, run_s=0.0, judge=False)
            return
        ok = outcome.error is None
        self.metrics.queue_wait.labels(task.stage, task.qos_class).observe(
            max(0.0, outcome.started_at - task.enqueued_at)
        )
        with self._lock:
            if not ok and dispatch.model_key not in self.workers[device.id].loaded:
                self.scheduler.unloaded(device.id, dispatch.model_key)
            self.scheduler.completed(
                dispatch, ok=ok, run_s=outcome.run_s, batch_size=outcome.batch_size
            )
            breaker = self.scheduler.breaker(task.stage, device.id)
            self.metrics.breaker_state.labels(task.stage, device.id).set(
                0 if breaker.state is BreakerState.CLOSED else 1
            )
            state = self._requests.get(task.request_id)
            if state is None:
                return  # cancelled or timed out meanwhile
            state.live_tasks.pop(task.id, None)
            offered = None
            if ok:
                assert outcome.outputs is not None
                offered = self._step_inputs(state, task.step, dispatch.model_key)
                size = sum(int(np.asarray(v).nbytes) for v in outcome.outputs.values())
                state.outputs[task.step] = OutputHandle(device.id, outcome.outputs, size)
                state.devices[task.step] = device.id
                error = None if state.done() else self._continue(state)
            else:
                error = self._retry(state, task, device.id, outcome.error)
            finished = error is not None or state.done()
            if finished:
                self._end(state)
        if offered is not None and outcome.outputs is not None:
            self._offer(task, offered, outcome.outputs)  # outside the lock: it does I/O
        if not finished:
            return
        if error is not None:
            self.metrics.requests.labels(state.route, "failed").inc()
            _settle(state.future, error=error)
            return
        self.metrics.requests.labels(state.route, "ok").inc()
        _settle(state.future, result=self._result(state))

    def _result(self, state: RequestState) -> EngineResult:
        stages = self.policy.spec.stages
        had_light = any(
            "light" in stages[step.stage].variants for step in state.pipeline.steps.values()
        )
        return EngineResult(
            request_id=state.request_id,
            outputs={sink: state.outputs[sink].value for sink in state.pipeline.sinks},
            devices=dict(state.devices),
            degraded=state.variant == "light" and had_light,
            latency_s=self.clock.now() - state.arrival,
        )

    def _continue(self, state: RequestState) -> BaseException | None:
        """Queue the steps a finished one unblocked (lock held); an error if shed."""
        try:
            self._enqueue_ready(state)
        except ShedError as err:
            return err
        return None

    def _retry(
        self, state: RequestState, task: StageTask, device_id: str, error: BaseException | None
    ) -> BaseException | None:
        """Send a failed task to another device (lock held); an error if none is left."""
        problem = f"{type(error).__name__}: {error}"
        self.metrics.failures.labels(task.stage, device_id).inc()
        logger.warning("%s: %s failed on %s: %s", task.request_id, task.step, device_id, problem)
        task.excluded = task.excluded | {device_id}
        task.failures = {**task.failures, device_id: problem}
        if len(task.excluded) >= self.scheduler.eligible_devices(task.stage, task.variant):
            reasons = {d: f"failed this request ({p})" for d, p in task.failures.items()}
            return NoEligibleDeviceError(task.stage, reasons)
        self.metrics.retries.labels(task.stage).inc()
        task.enqueued_at = self.clock.now()
        try:
            self.scheduler.enqueue(task)
        except ShedError as err:
            return err
        state.live_tasks[task.id] = task
        return None

    def _fail(self, request_id: str, error: BaseException) -> None:
        with self._lock:
            state = self._requests.get(request_id)
            if state is None:
                return
            self._end(state)
        self.metrics.requests.labels(state.route, "failed").inc()
        _settle(state.future, error=error)


def _settle(
    future: Future[EngineResult],
    *,
    result: EngineResult | None = None,
    error: BaseException | None = None,
) -> None:
    """Complete a future unless the caller already cancelled it."""
    try:
        if error is not None:
            future.set_exception(error)
        elif result is not None:
            future.set_result(result)
    except InvalidStateError:
        pass  # the caller cancelled it; the request's work was dropped with it


def _items(payload: Mapping[str, np.ndarray[Any, Any]]) -> int:
    for value in payload.values():
        if np.ndim(value):
            return int(np.shape(value)[0])
    return 1
