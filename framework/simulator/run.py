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
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hetero.backends.sim.calibration import load_multiplier
from hetero.backends.sim.timing import (
    LlmSequences,
    RunTime,
    modelled_prefill,
    modelled_run,
    modelled_steps,
)
from hetero.framework.devices import DeviceSpec
from hetero.framework.engine.request_graph import GraphNode
from hetero.framework.engine.request_walk import RequestWalk
from hetero.framework.engine.requests import RequestState
from hetero.framework.errors import ShedError
from hetero.framework.graph import BandwidthHint
from hetero.framework.policy import Policy
from hetero.framework.request_profile import RequestProfile
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
from hetero.framework.simulator.decode import DecodeEngine, DecodeSequence, EngineWork
from hetero.framework.simulator.kv import KvBatch, PagedKv
from hetero.framework.simulator.metrics import RunMetrics
from hetero.framework.simulator.workload import SimRequest, Workload
from hetero.framework.topology import Topology

__all__ = ["simulate"]

ARRIVAL, BATCH_DONE, TIMER, WARMUP, LOAD_DONE, ENGINE_DONE = 0, 1, 2, 3, 4, 5


@dataclass(slots=True)
class _RequestRun:
    request: SimRequest
    state: RequestState  # its walk: admitted variants, outputs, live tasks, shares held
    client: int | None


class _SimMeasures:
    """A stage's measures of a simulated request, as its plugin measures a real input: the
    images it holds (one input each: a task of an image stage carries that many items, as
    the engine's does), and for a stage with a KV cache the tokens a generation holds (its
    prompt plus those it generates; 0 elsewhere)."""

    __slots__ = ("image", "kv")

    def __init__(self, modality: str, kv: bool) -> None:
        self.image = modality == "image"
        self.kv = kv

    def items(self, payload: SimRequest) -> int:
        return max(1, payload.images) if self.image else 1

    def kv_tokens(self, payload: SimRequest, output_tokens: int) -> int:
        return payload.text_tokens + output_tokens if self.kv else 0


def _request_of(state: RequestState, step: str) -> SimRequest:
    """Every step of a simulated request measures the request itself."""
    request: SimRequest = state.payload
    return request


@dataclass
class _DeviceSim:
    spec: DeviceSpec
    batchers: dict[str, Batcher[Dispatch]] = field(default_factory=dict)
    loaded: set[str] = field(default_factory=set)
    prefetch: list[str] = field(default_factory=list)  # warm-up loads not started yet
    busy: bool = False
    engines: dict[str, DecodeEngine[Dispatch]] = field(default_factory=dict)  # continuous LLMs
    engine_key: str | None = None  # the engine whose work the device runs now

    def engine_work(self) -> bool:
        """An engine has sequences waiting or running."""
        return any(engine.has_work for engine in self.engines.values())


class _Simulation:
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
        self.events: list[tuple[float, int, int, object]] = []
        self.sequence = itertools.count()
        self.runs: dict[int, _RequestRun] = {}
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
        self.memory_moved: set[int] = set()
        self.last_used: np.ndarray | None = None
        self.last_kv: dict[int, float] = {}  # KV bytes allocated per device in that vector
        self.last_figures: tuple[float, float] | None = None
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

    def push(self, when: float, kind: int, payload: object) -> None:
        heapq.heappush(self.events, (when, next(self.sequence), kind, payload))

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

    def _observe_memory(self, when: float) -> None:
        if when < self.workload.spec.warmup_s:
            self.last_memory_time = when
            return
        dt = when - self.last_memory_time
        memory = self.scheduler.memory
        changed = self.last_used is None
        for index in self.memory_moved:
            model_bytes = float(memory[index].model_bytes)
            if model_bytes != self.model_bytes[index]:
                self.model_bytes[index] = model_bytes
                changed = True
        self.memory_moved.clear()
        kv: dict[int, float] = {}
        if self.kv.running:
            allocated_all = held_all = 0.0
            # Devices without a running batch add nothing: visit the others, in fleet order.
            running = sorted(self.order[d] for d, batches in self.kv.running.items() if batches)
            for index in running:
                allocated, held = self.kv.usage(self.device_ids[index], when)
                kv[index] = allocated
                allocated_all += allocated
                held_all += held
            self.metrics.observe_kv(allocated_all, held_all, dt)
        if changed or kv != self.last_kv:
            used = self.model_bytes.copy()
            for index, allocated in kv.items():
                used[index] += allocated
            self.last_figures = self.metrics.memory_figures(used / self.capacity)
            self.last_used, self.last_kv = used, kv
        self.metrics.observe_memory_figures(self.last_figures, dt)
        self.last_memory_time = when

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

    def _scale(self, dispatch: Dispatch) -> float:
        """Work of this request's stage relative to the hint's nominal item."""
        run = self.runs.get(int(dispatch.task.request_id))
        return 1.0 if run is None else self._request_scale(dispatch.task.stage, run.request)

    def _profile(self, stage: str, request: SimRequest) -> RequestProfile:
        """What the stage's plugin would measure of ``request``'s input (its profile): the
        pixels of its images, its audio's seconds, or its prompt's tokens plus those it
        generates (as the LLM plugin counts)."""
        modality = self.modality[stage]
        if modality == "image":
            spec = self.workload.spec
            pixels = (
                request.image_pixels or spec.stage_nominal.get(stage, spec.nominal).image_pixels
            )
            return RequestProfile(image_pixels=int(max(1, request.images) * pixels))
        if modality == "audio":
            return RequestProfile(audio_seconds=request.audio_seconds)
        return RequestProfile(text_tokens=request.text_tokens + request.output_tokens)

    def _request_scale(self, stage: str, request: SimRequest) -> float:
        """Work of ``request`` in ``stage`` relative to the hint's nominal item."""
        spec = self.workload.spec
        nominal = spec.stage_nominal.get(stage, spec.nominal)
        modality = self.modality[stage]
        if modality == "image" and request.images:
            pixels = request.image_pixels or nominal.image_pixels
            return request.images * pixels / nominal.image_pixels
        if modality == "audio" and request.audio_seconds:
            return request.audio_seconds / nominal.audio_seconds
        tokens = request.text_tokens + request.output_tokens
        if modality in {"text", "embedding"} and tokens:
            return tokens / nominal.text_tokens
        return 1.0

    def _transfer_s(self, dispatch: Dispatch, dst: int) -> float:
        """Time to bring a task's inputs to device ``dst``: from the devices that hold them
        (topology routes), or from the host for a first step."""
        fleet = self.scheduler.fleet
        if not dispatch.task.inputs:
            hint = self.scheduler.tables[dispatch.model_key].costs.hint
            size = hint.input_bytes * self._scale(dispatch)
            return float(size * fleet.ingress_inverse_bandwidth[dst])
        total = 0.0
        for handle in dispatch.task.inputs:
            src = fleet.index[handle.device_id]
            if src != dst:
                latency, inverse_bandwidth = fleet.route(src, dst)
                total += latency + handle.size_bytes * inverse_bandwidth
        return total

    def _before_run_s(
        self, device: _DeviceSim, key: str, index: int, dispatches: list[Dispatch]
    ) -> float:
        """Seconds before a run on ``device`` can compute: the model's load if it is not
        there yet (it is from then on), then the inputs, which move in parallel (the slowest
        counts)."""
        delay = 0.0
        if key not in device.loaded:
            delay += self._load_s(key, index)
            device.loaded.add(key)
            if key in device.prefetch:
                device.prefetch.remove(key)
        return delay + max(self._transfer_s(d, index) for d in dispatches)

    def _start(self, device: _DeviceSim, key: str, batch: list[Dispatch]) -> None:
        tables = self.scheduler.tables[key]
        hint = tables.costs.hint
        index = self.scheduler.fleet.index[device.spec.id]
        duration = self._before_run_s(device, key, index, batch)
        now = self.clock.now()
        times, kv_batch = self._modelled_run(hint, device.spec, key, batch, now + duration)
        run_s = times.seconds  # the sim backend's formula (modelled_run), LLM or not
        prefill_of = None
        if kv_batch is not None:
            prefill_of = duration + kv_batch.prefill_s
            self.kv.add(device.spec.id, kv_batch)
        duration += run_s
        for dispatch in batch:
            if (
                dispatch.task.qos_class == self.lowest_class
                and dispatch.task.arrival >= self.workload.spec.warmup_s
            ):
                self.metrics.lowest_class_waits.append(now - dispatch.task.enqueued_at)
            run = self.runs.get(int(dispatch.task.request_id))
            modality = self.modality[dispatch.task.stage]
            counted = run is not None and run.request.arrival >= self.workload.spec.warmup_s
            if run is not None and counted and modality == "text" and run.request.output_tokens:
                if prefill_of is None:
                    total = run.request.text_tokens + run.request.output_tokens
                    prefill = duration - run_s + run_s * run.request.text_tokens / max(total, 1)
                else:
                    prefill = prefill_of
                self.metrics.ttft.append(now + prefill - run.request.arrival)
        device.busy = True
        self.metrics.busy[device.spec.id].append((now, duration))
        self.push(now + duration, BATCH_DONE, (device.spec.id, batch, run_s, kv_batch))

    def _load_s(self, key: str, index: int) -> float:
        """One load: the modelled time times a draw from Alibaba's measured spread."""
        draw = load_multiplier(self.load_draws.random())
        return float(self.scheduler.tables[key].costs.load_s[index]) * draw

    def _warm_up(self, now: float) -> None:
        """A forecast bin closed: queue the warm-up's loads, forget what it released."""
        assert self.warmup is not None
        loads, released = self.warmup.tick(now)
        for load in loads:
            self.memory_moved.add(self.order[load.device_id])
            device = self.devices[load.device_id]
            for victim in load.plan.evict:
                device.loaded.discard(victim)
                if victim in device.prefetch:
                    device.prefetch.remove(victim)
            device.prefetch.append(load.plan.key)
        for device_id, key in released:
            self.memory_moved.add(self.order[device_id])
            self.devices[device_id].loaded.discard(key)
        if self.events:  # keep forecasting while anything is still to happen
            self.push(self.warmup.next_tick, WARMUP, None)

    def _start_prefetch(self, device: _DeviceSim) -> None:
        """An idle device with nothing ready runs a warm-up load (never ahead of work)."""
        index = self.scheduler.fleet.index[device.spec.id]
        while device.prefetch:
            key = device.prefetch.pop(0)
            if key in device.loaded or not self.scheduler.tables[key].resident[index]:
                continue
            duration = self._load_s(key, index)
            device.busy = True
            now = self.clock.now()
            self.metrics.busy[device.spec.id].append((now, duration))
            self.push(now + duration, LOAD_DONE, (device.spec.id, key))
            return

    def _load_done(self, device_id: str, key: str) -> None:
        device = self.devices[device_id]
        device.busy = False
        index = self.scheduler.fleet.index[device_id]
        if self.scheduler.tables[key].resident[index]:  # not evicted while it loaded
            device.loaded.add(key)

    def _modelled_run(
        self, hint: BandwidthHint, device: DeviceSpec, key: str, batch: list[Dispatch], start: float
    ) -> tuple[RunTime, KvBatch | None]:
        """The batch's modelled time (:func:`modelled_run`, the sim backend's formula) and, for
        an LLM stage (a stage with a KV cache), its phases and KV cache."""
        if not hint.kv_bytes_per_token:
            items = float(sum(self._scale(d) for d in batch))
            return modelled_run(hint, device, items), None
        stage = key.split("/", 1)[0]
        spec = self.workload.spec
        nominal = spec.stage_nominal.get(stage, spec.nominal).text_tokens
        prompts, outputs = [], []
        for dispatch in batch:
            run = self.runs.get(int(dispatch.task.request_id))
            request = run.request if run is not None else None
            prompts.append(request.text_tokens if request is not None else int(nominal))
            outputs.append(request.output_tokens if request is not None else 0)
        times = modelled_run(hint, device, len(batch), LlmSequences(prompts, outputs, nominal))
        return times, KvBatch(
            start=start,
            prefill_s=times.prefill_s,
            decode_s=times.decode_s,
            prompts=np.asarray(prompts, dtype=float),
            outputs=np.asarray(outputs, dtype=float),
            bytes_per_token=hint.kv_bytes_per_token,
        )

    def _batch_done(
        self, device_id: str, batch: list[Dispatch], run_s: float, kv_batch: KvBatch | None
    ) -> None:
        device = self.devices[device_id]
        device.busy = False
        if kv_batch is not None:
            self.kv.remove(device_id, kv_batch)
        first = batch[0]
        self.admission.observe(  # as the engine folds each batch it ran into the stage's pace
            first.task.stage,
            first.model_key.split("/", 1)[1],
            run_s,
            sum(d.task.items for d in batch) or 1,
            sum(d.task.units for d in batch),
        )
        for dispatch in batch:
            self._finish(dispatch, device_id, run_s, len(batch))

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

    # --- continuous batching of LLM stages (:mod:`decode`) -------------------------------------

    def _engine(self, device: _DeviceSim, key: str) -> DecodeEngine[Dispatch]:
        """The device's engine for LLM model ``key`` (made on its first dispatch)."""
        engine = device.engines.get(key)
        if engine is None:
            tables = self.scheduler.tables[key]
            hint = tables.costs.hint
            spec = self.workload.spec
            nominal = spec.stage_nominal.get(tables.costs.stage, spec.nominal).text_tokens
            index = self.order[device.spec.id]
            engine = DecodeEngine(
                max_running=int(tables.limit[index]),
                block_tokens=self.kv.block_tokens,
                bytes_per_token=hint.kv_bytes_per_token,
                prefill_s=lambda prompts: modelled_prefill(hint, device.spec, prompts, nominal),
                steps_s=lambda contexts, remaining: modelled_steps(
                    hint, device.spec, contexts, remaining, nominal
                ),
            )
            device.engines[key] = engine
        return engine

    def _sequence(self, dispatch: Dispatch) -> DecodeSequence[Dispatch]:
        """The engine's view of a dispatched LLM task: its prompt and output length."""
        run = self.runs.get(int(dispatch.task.request_id))
        if run is None:  # dropped meanwhile: a nominal prompt, nothing to generate
            spec = self.workload.spec
            nominal = spec.stage_nominal.get(dispatch.task.stage, spec.nominal).text_tokens
            return DecodeSequence(dispatch, int(nominal), 0)
        return DecodeSequence(dispatch, run.request.text_tokens, run.request.output_tokens)

    def _kv_budget_blocks(self, device: _DeviceSim, key: str, now: float) -> int:
        """Blocks of KV cache engine ``key`` may hold on the device: its memory after the
        resident models and the other engines' blocks."""
        manager = self.scheduler.memory[self.order[device.spec.id]]
        free = float(manager.capacity - manager.model_bytes)
        block = self.kv.block_tokens
        for other, engine in device.engines.items():
            if other != key:
                free -= (
                    float(np.ceil(engine.tokens(now) / block).sum())
                    * block
                    * (engine.bytes_per_token)
                )
        engine = device.engines[key]
        return max(0, int(free // (block * engine.bytes_per_token)))

    def _start_engine(self, device: _DeviceSim, now: float) -> bool:
        """An idle device runs its engines' next work (the first engine, by key, that has
        any); False when none has."""
        for key in sorted(device.engines):
            engine = device.engines[key]
            if not engine.has_work:
                continue
            work = engine.next_work(now, self._kv_budget_blocks(device, key, now))
            if work is None:
                continue
            if work.kind == "prefill":
                self._prefill_starts(device, key, work, now)
            device.busy = True
            device.engine_key = key
            self.push(work.end, ENGINE_DONE, (device.spec.id, key, engine.generation))
            return True
        return False

    def _prefill_starts(
        self, device: _DeviceSim, key: str, work: EngineWork[Dispatch], now: float
    ) -> None:
        """A prefill step starts: the model's load (if it is not on the device yet) and the
        joining requests' inputs come first; their waits and first tokens are counted."""
        index = self.scheduler.fleet.index[device.spec.id]
        delay = self._before_run_s(device, key, index, [s.item for s in work.joining])
        work.ends = work.ends + delay
        for sequence in work.joining:
            sequence.before_run_s += delay
        warmup_s = self.workload.spec.warmup_s
        for sequence in work.joining:
            if sequence.admitted_at != now or sequence.generated:
                continue  # readmitted after a preemption: counted the first time
            task = sequence.item.task
            if task.qos_class == self.lowest_class and task.arrival >= warmup_s:
                self.metrics.lowest_class_waits.append(now - task.enqueued_at)
            run = self.runs.get(int(task.request_id))
            if run is not None and run.request.arrival >= warmup_s and sequence.output:
                self.metrics.ttft.append(work.end - run.request.arrival)

    def _cut_window(self, device: _DeviceSim, now: float) -> None:
        """Other work wants the device: end the running decode window at the next step."""
        assert device.engine_key is not None
        engine = device.engines[device.engine_key]
        wanted = any(e.wants_step_boundary() for e in device.engines.values()) or any(
            b.ready(now) for b in device.batchers.values()
        )
        if wanted and (end := engine.truncate(now)) is not None:
            self.push(end, ENGINE_DONE, (device.spec.id, device.engine_key, engine.generation))

    def _engine_done(self, device_id: str, key: str, generation: int) -> None:
        device = self.devices[device_id]
        engine = device.engines[key]
        work = engine.work
        if generation != engine.generation or work is None:
            return  # the window was cut: a later event ends it
        now = self.clock.now()
        self.metrics.busy[device_id].append((work.start, now - work.start))
        device.busy = False
        device.engine_key = None
        finished = engine.finish()
        if not engine.has_work:
            self.kv.remove(device_id, engine)
        for sequence in finished:
            # its time in the engine, less the loads and transfers before its prefills: what
            # the scheduler's correction and slow-call breaker judge is the device's running
            run_s = max(0.0, now - (sequence.admitted_at or now) - sequence.before_run_s)
            task = sequence.item.task
            variant = sequence.item.model_key.split("/", 1)[1]
            self.admission.observe(task.stage, variant, run_s, task.items, task.units)
            self._finish(sequence.item, device_id, run_s, max(1, round(sequence.mean_batch)))


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
