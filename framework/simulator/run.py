"""The discrete-event simulation: the SAME request walk (admission of every stage, fair shares,
the tasks of ready steps: :mod:`~hetero.framework.engine.request_walk`), scheduler, placement,
memory manager, batching and breakers as the engine, on simulated devices and a virtual clock.

Events are arrivals, batch completions and batch timers. After each event the scheduler
dispatches what it can; each device runs one batch at a time, taking the model's load time first
when it is not resident (evictions follow the scheduler's plans; a load lasts the modelled time
times a draw from Alibaba's measured spread). A batch lasts the modelled time of the sim backend
(:func:`modelled_run`, the one formula), scaled by the requests' sizes against the workload's
nominal size (text tokens, image count, audio seconds); for an LLM stage (its hint has
``kv_bytes_per_token``) the formula takes each request's prompt and output tokens phase by
phase, and its KV cache grows in paged blocks while it runs (:mod:`kv`).

LLM stages batch continuously by default (``scheduler.batching.llm: continuous``, as vLLM-style
engines do): a dispatch to an LLM model joins that device's engine (:mod:`decode`), which admits
it at the next decode step boundary, runs its prefill, then decodes it with whatever else is
running until its last token. The device is one serial resource: another model's ready batch,
or a request that can join, cuts the engine's decode window at the end of the step in
progress. ``static`` keeps the earlier model (a batch runs until its longest output is done).
Every placement gets the same batching.

The parts: this module runs the events and walks the requests; :mod:`run_devices` runs batches
and loads on the devices and observes their memory; :mod:`run_decode` runs the continuous-batching
engines; :mod:`run_measures` sizes a request per stage; :mod:`run_state` declares what they share.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable, Sequence

import numpy as np

from hetero.framework.devices import DeviceSpec
from hetero.framework.engine.request_graph import GraphNode
from hetero.framework.engine.request_walk import RequestWalk
from hetero.framework.engine.requests import RequestState
from hetero.framework.errors import ShedError
from hetero.framework.policy import Policy
from hetero.framework.scheduler import (
    Batcher,
    Dispatch,
    OutputHandle,
    Rejection,
    Scheduler,
    VirtualClock,
)
from hetero.framework.scheduler.warmup import PredictiveWarmup
from hetero.framework.simulator.admission import SimAdmission
from hetero.framework.simulator.arrivals import (
    RequestSource,
    check_against_policy,
    open_loop_requests,
    request_from_kind,
)
from hetero.framework.simulator.kv import PagedKv
from hetero.framework.simulator.metrics import RunMetrics
from hetero.framework.simulator.run_decode import DecodeMixin
from hetero.framework.simulator.run_measures import _request_of, _SimMeasures
from hetero.framework.simulator.run_state import (
    ARRIVAL,
    BATCH_DONE,
    ENGINE_DONE,
    LOAD_DONE,
    TIMER,
    WARMUP,
    _DeviceSim,
    _RequestRun,
)
from hetero.framework.simulator.workload import SimRequest, Workload
from hetero.framework.topology import Topology

__all__ = ["simulate"]


class _Simulation(DecodeMixin):
    """One run of a workload: its events, requests, dispatches and the figures they give (the
    device runs and loads: :class:`DevicesMixin`; the LLM engines: :class:`DecodeMixin`)."""

    def __init__(
        self,
        policy: Policy,
        devices: Sequence[DeviceSpec],
        topology: Topology,
        workload: Workload,
        placement: str,
        eviction: str,
    ) -> None:
        self.policy = policy
        self.workload = workload
        self.clock = VirtualClock()
        self.scheduler = Scheduler(
            policy, devices, topology, self.clock, placement=placement, eviction=eviction
        )
        warmup = policy.spec.scheduler.warmup
        self.warmup = (
            PredictiveWarmup(self.scheduler, warmup)
            if warmup.enabled or eviction == "predictive"
            else None
        )
        self.admission = SimAdmission(policy, self.scheduler)
        self.devices = {d.id: _DeviceSim(d) for d in devices}
        self.events = []
        self.sequence = itertools.count()
        self.runs = {}
        name = placement if eviction == "cost_aware" else f"{placement}+{eviction}"
        self.metrics = RunMetrics(policy=name)
        spec = policy.spec
        self.metrics.deadlines = {
            q: spec.sla_tiers[c.sla_tier].deadline_ms / 1000.0 for q, c in spec.qos.classes.items()
        }
        self.lowest_class = min(sorted(spec.qos.classes), key=lambda q: spec.qos.classes[q].weight)
        self.capacity = np.array([m.capacity for m in self.scheduler.memory], dtype=float)
        # Bytes of resident models per device, re-read only where a dispatch, a warm-up load or
        # a release moved them (the only places memory changes in a simulation), and the
        # utilisation figures of the last vector, reused while it stays the same.
        self.model_bytes = np.array([m.model_bytes for m in self.scheduler.memory], dtype=float)
        self.memory_moved = set()
        self.last_used = None
        self.last_kv = {}  # KV bytes allocated per device in that vector
        self.last_figures = None
        self.order = {d.id: index for index, d in enumerate(devices)}
        self.device_ids = [d.id for d in devices]
        # Read per event: plain dicts (the policy's maps are persistent, slower to index).
        self.modality = {name: stage.modality for name, stage in spec.stages.items()}
        self.variants = {name: frozenset(stage.variants) for name, stage in spec.stages.items()}
        self.pipelines = {route: policy.pipeline_for_route(route) for route in spec.routes}
        self.waiting: set[str] = set()  # devices with items in a batcher
        # Devices whose state this event moved (its own device, those dispatched to): only they
        # can start something, but on a timer or a warm-up tick, which may move any device.
        self.touched: set[str] = set()
        self.last_memory_time = 0.0
        self.clients: dict[int, RequestSource] = {}
        self.wake_at = float("inf")
        self.loads_at_warmup: int | None = None
        self.evictions_at_warmup = 0
        self.kv = PagedKv(spec.scheduler.kv_block_tokens)
        self.continuous = spec.scheduler.batching.llm == "continuous"
        # the engine's request walk: admission of every stage, the tasks of ready steps
        measures = {
            name: _SimMeasures(stage.modality, bool(stage.variants["full"].kv_bytes_per_token))
            for name, stage in spec.stages.items()
        }
        self.walk = RequestWalk(self.admission, self.scheduler, measures)
        self.load_draws = random.Random(workload.spec.seed)
        self._seed_paces()

    def _seed_paces(self) -> None:
        """Admission's paces before any batch ran, as the engine's warm-up probe seeds them:
        one nominal item on the fastest device that runs each stage variant."""
        spec = self.workload.spec
        for name, stage in self.policy.spec.stages.items():
            nominal = spec.stage_nominal.get(name, spec.nominal)
            probe = SimRequest(
                index=-1,
                arrival=0.0,
                route="",
                qos=None,
                text_tokens=int(nominal.text_tokens),
                images=1,
                image_pixels=int(nominal.image_pixels),
                audio_seconds=nominal.audio_seconds,
            )
            units = self.admission.units(self._profile(name, probe))
            for variant in stage.variants:
                run_s = self.scheduler.fastest_s(name, str(variant))
                if np.isfinite(run_s):
                    self.admission.pace(name, str(variant)).seed(run_s, 1, units)

    # --- events ------------------------------------------------------------------------------

    def run(self, progress: Callable[[float], None] | None = None) -> RunMetrics:
        started, cpu_started = time.perf_counter(), time.thread_time()
        spec = self.workload.spec
        check_against_policy(self.workload, self.policy)
        self.metrics.warmup_s = spec.warmup_s
        if spec.arrivals.kind == "closed_loop":
            assert spec.arrivals.clients is not None
            for client in range(spec.arrivals.clients):
                self._next_closed_loop(client, 0.0)
        else:
            for request in open_loop_requests(self.workload, self.policy):
                self.push(request.arrival, ARRIVAL, (request, None))
        self.metrics.first_arrival = self.events[0][0] if self.events else 0.0
        if self.warmup is not None:
            self.push(self.warmup.next_tick, WARMUP, None)
        self.last_memory_time = self.metrics.first_arrival
        while self.events:
            when, _, kind, payload = heapq.heappop(self.events)
            if self.loads_at_warmup is None and when >= spec.warmup_s:
                self.loads_at_warmup = self.scheduler.stats.counts["loads"]
                self.evictions_at_warmup = self.scheduler.stats.counts["evictions"]
            self._observe_memory(when)
            self.clock.advance_to(when)
            self.metrics.events += 1
            if kind == ARRIVAL:
                self._arrive(*payload)  # type: ignore[misc]
            elif kind == BATCH_DONE:
                self._batch_done(*payload)  # type: ignore[misc]
            elif kind == WARMUP:
                self._warm_up(when)
            elif kind == LOAD_DONE:
                self._load_done(*payload)  # type: ignore[misc]
            elif kind == ENGINE_DONE:
                self._engine_done(*payload)  # type: ignore[misc]
            if kind in (BATCH_DONE, LOAD_DONE, ENGINE_DONE):
                self.touched.add(payload[0])  # type: ignore[index]
            self._dispatch()
            self._start_batches(visit_all=kind in (TIMER, WARMUP))
            retry = self.scheduler.next_retry_at
            if retry != self.wake_at and retry > when and retry != float("inf"):
                self.wake_at = retry  # a stage waits for a model's minimum residency to end
                self.push(retry, TIMER, None)
            if progress is not None and self.metrics.events % 2000 == 0:
                progress(when)
        self.metrics.loads = self.scheduler.stats.counts["loads"] - (self.loads_at_warmup or 0)
        self.metrics.evictions = self.scheduler.stats.counts["evictions"] - self.evictions_at_warmup
        self.metrics.breaker_trips = self.scheduler.stats.counts["breaker_open"]
        self.metrics.preemptions = sum(
            e.preemptions for d in self.devices.values() for e in d.engines.values()
        )
        self.metrics.wall_s = time.perf_counter() - started
        self.metrics.cpu_s = time.thread_time() - cpu_started
        return self.metrics

    def _next_closed_loop(self, client: int, now: float) -> None:
        spec = self.workload.spec
        if now > spec.duration_s:
            return
        if client not in self.clients:
            self.clients[client] = RequestSource(self.workload, stream=client)
        kind = self.clients[client].kind()
        request = request_from_kind(kind, next(self.sequence), now + spec.arrivals.think_time_s)
        self.push(request.arrival, ARRIVAL, (request, client))

    # --- requests ----------------------------------------------------------------------------

    def _arrive(self, request: SimRequest, client: int | None) -> None:
        spec = self.policy.spec
        qos = request.qos or spec.qos.default_class
        if request.arrival >= self.workload.spec.warmup_s:
            self.metrics.offered_by_class[qos] += 1
        pipeline = self.pipelines[request.route]
        if self.warmup is not None:
            stages = sorted({step.stage for step in pipeline.steps.values()})
            self.warmup.observe([f"{stage}/full" for stage in stages], request.arrival)
        state = RequestState(
            request_id=str(request.index),
            route=request.route,
            pipeline=pipeline,
            payload=request,
            qos_class=qos,
            variant="full",
            arrival=request.arrival,
            deadline=request.arrival + self.metrics.deadlines[qos],
            principal=request.tenant,
        )
        nodes = {
            step: GraphNode(
                node.stage, node.after, payload=request, profile=self._profile(node.stage, request)
            )
            for step, node in pipeline.steps.items()
        }
        try:  # the engine's admission: every stage, its pace, queue and fair shares
            self.walk.begin(state, nodes)
        except ShedError:
            self._shed(client)
            return
        self.walk.hold(state)
        run = _RequestRun(request, state, client)
        self.runs[request.index] = run
        self._enqueue_ready(run)

    def _drop(self, run: _RequestRun) -> None:
        """Forget a request that will not finish: its shares go back, its queued steps are
        dropped."""
        self.runs.pop(run.request.index, None)
        self.walk.end(run.state)

    def _back_off(self, client: int | None) -> None:
        if client is not None:  # a refused closed-loop client waits a second and tries again
            self._next_closed_loop(client, self.clock.now() + 1.0)

    def _shed(self, client: int | None) -> None:
        self.metrics.shed += 1
        self._back_off(client)

    def _enqueue_ready(self, run: _RequestRun) -> None:
        """Queue the request's ready steps (the walk's tasks); shed it whole when the
        scheduler's queue refuses one."""
        try:
            self.walk.enqueue_ready(run.state, _request_of)
        except ShedError:
            self._drop(run)
            self._shed(run.client)

    def _dispatch(self) -> None:
        while (outcome := self.scheduler.dispatch()) is not None:
            if isinstance(outcome, Rejection):
                run = self.runs.get(int(outcome.task.request_id))
                if run is not None:
                    self._drop(run)
                    self.metrics.failed += 1
                    self._back_off(run.client)
                continue
            self.admission.started(outcome.task)
            device = self.devices[outcome.device_id]
            self.waiting.add(outcome.device_id)
            self.touched.add(outcome.device_id)
            if outcome.load.load or outcome.load.evict:
                self.memory_moved.add(self.order[outcome.device_id])
            for victim in outcome.load.evict:
                device.loaded.discard(victim)
                if victim in device.prefetch:
                    device.prefetch.remove(victim)
            key = outcome.model_key
            if key not in device.loaded and outcome.task.arrival >= self.workload.spec.warmup_s:
                self.metrics.load_waits += 1
            hint = self.scheduler.tables[key].costs.hint
            if self.continuous and hint.kv_bytes_per_token:
                engine = self._engine(device, key)
                if not engine.has_work:  # the memory figures visit engines with sequences
                    self.kv.add(outcome.device_id, engine)
                engine.add(self._sequence(outcome))
                continue
            if key not in device.batchers:
                size, delay_s = self.scheduler.batching_for(key)
                device.batchers[key] = Batcher(max_batch=size, max_delay_s=delay_s)
            batcher = device.batchers[key]
            batcher.add(outcome, self.clock.now())
            due = batcher.due_at()
            if due is not None:
                self.push(due, TIMER, None)

    def _start_batches(self, visit_all: bool) -> None:
        """Start what the waiting devices can run now, in fleet order. A device this event
        did not touch is skipped unless ``visit_all``: its batchers become ready only when
        dispatched to or on a timer, its engines and loads move only on its own events, so
        a visit would do nothing (the figures are the same to the last digit either way)."""
        now = self.clock.now()
        visit = self.waiting if visit_all else self.waiting & self.touched
        self.touched.clear()
        # In fleet order; a copy either way, since a visit may take its device off waiting.
        devices = sorted(visit, key=self.order.__getitem__) if len(visit) > 1 else list(visit)
        for device_id in devices:
            device = self.devices[device_id]
            if device.busy:
                if device.engine_key is not None:
                    self._cut_window(device, now)
                continue
            ready = [(b.due_at() or now, key) for key, b in device.batchers.items() if b.ready(now)]
            if ready:
                _, key = min(ready)
                self._start(device, key, device.batchers[key].take(now))
            elif device.engines and self._start_engine(device, now):
                # another engine of the device (a light variant's) may already wait for a
                # step boundary: the window it started ends at its first one
                self._cut_window(device, now)
            else:
                self._start_prefetch(device)
            if not any(device.batchers.values()) and not device.engine_work():
                self.waiting.discard(device_id)

    def _finish(self, dispatch: Dispatch, device_id: str, run_s: float, batch_size: int) -> None:
        """One task's stage is done: report it, then finish its request or queue its next
        steps."""
        now = self.clock.now()
        self.scheduler.completed(dispatch, ok=True, run_s=run_s, batch_size=batch_size)
        self.admission.finished(dispatch.task)
        run = self.runs.get(int(dispatch.task.request_id))
        if run is None:
            return
        hint = self.scheduler.tables[dispatch.model_key].costs.hint
        if hint.kv_bytes_per_token and run.request.output_tokens:  # a generation: learnt,
            # as a server learns it from the answers it gave, and how long it took
            self.scheduler.output_lengths.observe(dispatch.task.stage, run.request.output_tokens)
            self.scheduler.output_lengths.times.finished(dispatch.task.id, now)
        output = OutputHandle(device_id, None, int(hint.output_bytes * self._scale(dispatch)))
        if not self.walk.record(run.state, dispatch.task, output):
            self._enqueue_ready(run)
            return
        del self.runs[run.request.index]
        self.walk.end(run.state)
        latency = now - run.request.arrival
        if run.request.arrival >= self.workload.spec.warmup_s:
            self.metrics.latencies.append(latency)
            self.metrics.latencies_by_class[run.state.qos_class].append(latency)
        self.metrics.completed += 1
        self.metrics.last_completion = now
        if run.client is not None:
            self._next_closed_loop(run.client, now)


def simulate(
    policy: Policy,
    devices: Sequence[DeviceSpec],
    topology: Topology,
    workload: Workload,
    *,
    placement: str = "cost_model",
    eviction: str = "cost_aware",
    progress: Callable[[float], None] | None = None,
) -> RunMetrics:
    """Run ``workload`` on ``devices`` under one placement (and eviction) policy."""
    simulation = _Simulation(policy, devices, topology, workload, placement, eviction)
    return simulation.run(progress)
