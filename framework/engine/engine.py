"""The engine: the one way anything runs a model.

It strings the parts together and nothing else: stage plugins (every stage, a bare graph
included, runs through the plugin contract), admission (the complexity breaker and the queue
depth that degrades to a light variant), the scheduler (QoS queues with aging, cost-model
placement calibrated by measured runs, memory manager, per-device failure breakers), one lane
per (stage, device) so a heavy stage never blocks a light one, and futures for callers. A device
that raises gets its breaker informed and the task retried on another device; a request fails
only when no device is left to try, and then with every device's failure in the error.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from hetero.framework.backend import Backend
from hetero.framework.devices import DeviceSpec
from hetero.framework.engine.graph_stage import GraphStage
from hetero.framework.engine.lanes import (
    BatchOutcome,
    DeviceModels,
    Lane,
    ModelHost,
)
from hetero.framework.engine.metrics import Metrics
from hetero.framework.engine.pacing import Pace, Shares
from hetero.framework.engine.request_graph import FeatureStore, GraphNode, RequestGraph
from hetero.framework.engine.requests import EngineResult, RequestState, StepTrace
from hetero.framework.errors import (
    HeteroError,
    InputLostError,
    NoEligibleDeviceError,
    QueueFullError,
    RequestTimeoutError,
    ShedError,
    UnknownRouteError,
)
from hetero.framework.fleet import Fleet, backend_for, resolve_fleet
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.policy import Policy
from hetero.framework.policy.schema import StageConfig
from hetero.framework.registry import Registry
from hetero.framework.remote import materialize
from hetero.framework.scheduler import (
    BreakerState,
    Dispatch,
    OutputHandle,
    Rejection,
    RequestProfile,
    Scheduler,
    StageTask,
    WallClock,
)
from hetero.framework.scheduler.admission import StageAdmission
from hetero.framework.sizes import nbytes_of
from hetero.framework.stage_cache import StageCache
from hetero.framework.stage_plugin import StagePlugin, combined_hint
from hetero.framework.stages import Pipeline, PipelineStep

__all__ = ["AccessGate", "AccessRefusedError", "Engine", "StageStatus"]


class AccessGate(Protocol):
    """Decides whether a principal may run a stage that touches a partition (and records the
    decision), and masks what the stage returns for that principal.
    ``hetero.sandbox.gate.ComplianceGate`` is the implementation."""

    def authorize(self, principal: Any, stage: str, request_id: str) -> None:
        """Return to allow; raise (a ``PermissionError``) to refuse."""
        ...

    def mask(self, principal: Any, stage: str, value: Any) -> Any:
        """``value`` with the fields ``principal`` may not see masked."""
        ...


class AccessRefusedError(HeteroError, PermissionError):
    """A request reaches a partition the engine may not touch."""


logger = logging.getLogger(__name__)

DISPATCH_POLL_S = 0.05
CACHE_DEVICE = "cache"  # where a cached output "lives": the host, for transfer costs
PROBE_RUNS = 2
RECENT_RUNS = 4096
# How often one request may have its steps made again because their kept outputs were lost
# (their node left, their keeper dropped them for room); past it the request fails with the
# last loss rather than loop while a cluster keeps losing its work.
MAX_INPUT_REDOS = 3
_request_ids = itertools.count(1)
Progress = Callable[[str, str], None]


@dataclass
class StageStatus:
    """Where a stage stands: ``waiting``, ``loading``, ``ready`` or ``failed`` (with why)."""

    state: str = "waiting"
    reason: str = ""
    timings: dict[str, float | str] = field(default_factory=dict)
    recent_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_RUNS))
    light_runs: int = 0
    batches: int = 0
    paces: dict[str, Pace] = field(default_factory=dict)  # by variant: admission's estimates

    def pace(self, variant: str) -> Pace:
        """The measured pace of ``variant`` (made on first use)."""
        return self.paces.setdefault(variant, Pace())


class Engine:
    """Pipelines and stages on real devices. Use as a context manager, or call :meth:`start`
    (and :meth:`warm_up` for plugin stages) and :meth:`close`.

    Args:
        policy: The policy snapshot.
        registry: Where backends come from.
        graphs: Bare graphs of stages that have no plugin, keyed ``stage/variant`` (a missing
            ``light`` falls back to ``full``). A step receives its dependencies' outputs merged
            (or the request payload, for a first step), filtered to the graph's
            ``input_names`` if set.
        plugins: Stage plugins by policy stage name; their graphs' hints are the cost the
            scheduler plans with.
        fleet: Devices to use (default: the policy's fleet on this host).
        placement: Override the policy's placement policy.
        cache: Array outputs of bare-graph steps by input content
            (``hetero.cache.StageOutputCache``).
        gate: Access decisions for stages with a partition, asked for every such step before
            the request is queued. Without a gate, a route that reaches a partition is refused.
        metrics: Where to count (a fresh registry by default).
        threads: Intra-op threads of each stage's graphs, by stage (policy ``server``).
        pinned: A runtime library per stage (policy ``server.runtimes``): the stage is placed
            only on devices of that runtime.
        nice: A CPU priority per stage (policy ``server.nice``) for its lanes' threads.
        probe: Time each eligible device at warm-up (calibration), or trust the cost model.
        features: The feature cache, for request graphs' steps that carry a cache key.
    """

    def __init__(
        self,
        policy: Policy,
        registry: Registry,
        graphs: Mapping[str, ComputeGraph] | None = None,
        *,
        plugins: Mapping[str, StagePlugin] | None = None,
        fleet: Fleet | None = None,
        placement: str | None = None,
        cache: StageCache | None = None,
        gate: AccessGate | None = None,
        metrics: Metrics | None = None,
        threads: Mapping[str, int] | None = None,
        pinned: Mapping[str, str] | None = None,
        nice: Mapping[str, int] | None = None,
        probe: bool = True,
        features: FeatureStore | None = None,
    ) -> None:
        self.policy = policy
        self.cache = cache
        self.features = features
        self.gate = gate
        self.probe = probe
        self.plugins: dict[str, StagePlugin] = dict(plugins or {})
        for stage, variants in _by_stage(graphs or {}).items():
            self.plugins.setdefault(stage, GraphStage(stage, variants))
        self._threads = dict(threads or {})
        self._pinned = dict(pinned or {})
        self._nice = dict(nice or {})
        self._unfit: dict[tuple[str, str], str] = {}  # (stage, device): why warm-up failed
        self.fleet = fleet or resolve_fleet(policy, registry)
        self.clock = WallClock()
        self.metrics = metrics or Metrics()
        self.backends: dict[str, Backend] = {}
        for device in self.fleet.devices:
            if device.backend not in self.backends:
                self.backends[device.backend] = backend_for(device.backend, policy, registry)
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
        for stage, plugin in self.plugins.items():
            if isinstance(plugin, GraphStage):  # bare graphs carry their cost: use it now
                for variant in policy.spec.stages[stage].variants:
                    hint = combined_hint(plugin.graphs(str(variant)))
                    self.scheduler.set_hint(stage, str(variant), hint)
        self.status: dict[str, StageStatus] = {name: StageStatus() for name in self.plugins}
        self.admission = StageAdmission(policy)
        self._single: dict[str, Pipeline] = {}  # the one-step pipeline of each stage
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._wake_membership = threading.Event()
        self._stopping = False
        self._requests: dict[str, RequestState] = {}
        self._running: dict[str, int] = dict.fromkeys(policy.spec.stages, 0)
        self._running_items: dict[str, int] = dict.fromkeys(policy.spec.stages, 0)
        self._running_units: dict[str, float] = dict.fromkeys(policy.spec.stages, 0.0)
        self._shares = Shares()
        self._added: dict[str, StageConfig] = {}  # stages taken in while running (add_stage)
        self._remote_outputs = False  # set by _host for a device whose models live elsewhere
        self.models: dict[str, ModelHost] = {d.id: self._host(d) for d in self.fleet.devices}
        self._lanes: dict[tuple[str, str], Lane] = {}
        self._lanes_lock = threading.Lock()
        self._dispatcher = threading.Thread(
            target=self._dispatch_loop, name="hetero-dispatch", daemon=True
        )
        self._heartbeat = threading.Thread(
            target=self._membership_loop, name="hetero-membership", daemon=True
        )
        self._started = False
        for stage in policy.spec.stages:
            self.metrics.queue_depth.labels(stage).set_function(
                lambda s=stage: self.scheduler.queued(s)  # type: ignore[misc]
            )
        for index, device in enumerate(self.fleet.devices):
            self.metrics.resident_bytes.labels(device.id).set_function(
                lambda i=index: self.scheduler.memory[i].used  # type: ignore[misc]
            )
            for stage in self.plugins:  # known series start at 0: a dashboard sees "none yet"
                self.metrics.loads.labels(stage, device.id)
                self.metrics.evictions.labels(stage, device.id)
                self.metrics.breaker_state.labels(stage, device.id).set(0)

    # --- placement rules ---------------------------------------------------------------------

    def format_for(self, stage: str, device_id: str) -> GraphFormat | None:
        """The graph format ``stage`` runs in on ``device_id``: the first of its plugin's
        formats the device takes for its main graph (None when it cannot run there)."""
        plugin = self.plugins.get(stage)
        device = self._device_by_id.get(device_id)
        if plugin is None or device is None:
            return None
        if plugin.device_ids is not None and device_id not in plugin.device_ids:
            return None
        if (stage, device_id) in self._unfit:
            return None
        pin = self._pinned.get(stage)
        if pin is not None and device.properties.get("runtime") != pin:
            return None
        if not plugin.formats:  # nothing to load: only its named devices run it
            return GraphFormat.ONNX if plugin.device_ids is not None else None
        backend = self.backends[device.backend]
        for graph_format in plugin.formats:
            if backend.accepts(graph_format, device_id):
                return graph_format
        return None

    def _can_run(self, stage: str, variant: str, device_id: str) -> bool:
        return self.format_for(stage, device_id) is not None

    def _host(self, device: DeviceSpec) -> ModelHost:
        """Where ``device``'s models are held: this process, or (a Ray node's device) the
        device actor its backend keeps on that node."""
        backend = self.backends[device.backend]
        if backend.supports_model_hosts:
            self._remote_outputs = True  # outputs may stay on its node: fetch before use
            host: ModelHost = backend.model_host(device)
            return host
        return DeviceModels(backend, device)

    def _fetched(self, value: Any) -> Any:
        """``value`` with outputs kept on other nodes fetched; as it is when every device's
        models live in this process (nothing to fetch, so the value is not walked)."""
        return materialize(value) if self._remote_outputs else value

    # --- start-up ------------------------------------------------------------------------------

    def start(self) -> Engine:
        """Start the dispatcher; bare-graph stages are ready at once, plugin stages once
        :meth:`warm_up` has loaded them."""
        if not self._started:
            for stage, plugin in self.plugins.items():
                if isinstance(plugin, GraphStage):
                    self.status[stage].state = "ready"
            self._dispatcher.start()
            if any(b.supports_membership for b in self.backends.values()):
                self._heartbeat.start()
            self._started = True
        return self

    def warm_up(
        self,
        stages: list[str] | None = None,
        progress: Progress | None = None,
        *,
        stop: threading.Event | None = None,
    ) -> dict[str, str]:
        """Prepare, set up, calibrate and place every plugin stage (or ``stages``), one after
        another; a stage that fails is recorded (``status[stage].reason``) and skipped.
        Returns the failures by stage."""
        report = progress or (lambda stage, message: None)
        failed: dict[str, str] = {}
        for stage in stages if stages is not None else list(self.plugins):
            if self._stopping or (stop is not None and stop.is_set()):
                break
            status = self.status[stage]
            if status.state == "ready":
                continue
            status.state = "loading"
            report(stage, "loading")
            try:
                where = self._warm_stage(stage, report)
            except Exception as err:
                status.state, status.reason = "failed", describe_failure(err)
                failed[stage] = status.reason
                logger.error("stage %s failed to load: %s", stage, status.reason)
                report(stage, f"failed: {status.reason}")
                continue
            status.state = "ready"
            report(stage, f"ready on {where}")
        return failed

    def _warm_stage(self, stage: str, report: Progress) -> str:
        plugin = self.plugins[stage]
        plugin.prepare()
        plugin.setup()
        self._set_hints(stage)
        candidates = self.scheduler.runnable_devices(stage)
        if not candidates:
            reasons = self.scheduler.tables[f"{stage}/full"].costs.why_not
            why = {d.id: r for d, r in zip(self.fleet.devices, reasons, strict=True) if r}
            raise NoEligibleDeviceError(stage, why)
        key = f"{stage}/full"
        probe = plugin.probe_payload() if self.probe and len(candidates) > 1 else None
        timings = self.status[stage].timings
        errors: dict[str, Exception] = {}
        if probe is not None:
            for device_id in candidates:
                report(stage, f"timing on {device_id}")
                try:
                    timings[device_id] = self._time(stage, device_id, probe)
                except Exception as err:
                    errors[device_id] = err
                    timings[device_id] = f"unavailable: {describe_failure(err)}"
                    logger.warning("stage %s: %s unavailable: %s", stage, device_id, err)
                    self.models[device_id].evict(key)
                    self._unfit[(stage, device_id)] = str(timings[device_id])
            if errors:  # placement leaves out the devices that could not run it
                self._set_hints(stage)
            measured = [d for d in candidates if d not in errors]
            if not measured:
                causes = {describe_failure(err) for err in errors.values()}
                if len(causes) == 1:  # the same cause everywhere: that is the reason
                    raise next(iter(errors.values()))
                raise RuntimeError("; ".join(f"{d}: {timings[d]}" for d in candidates))
            candidates = measured
        best = min(candidates, key=lambda d: self.scheduler.estimate_s(stage, "full", d))
        for device_id in candidates:  # timed devices give their copy back; the best keeps it
            if device_id != best:
                self.models[device_id].evict(key)
        self._preload(stage, best)
        if self.probe and best not in timings and self.models[best].resident(key):
            self._seed_pace(stage, best)
        return best

    def _seed_pace(self, stage: str, device_id: str) -> None:
        """Time the probe on the one device a stage has, so admission knows its pace before
        the first request (a burst arriving at once is judged, not admitted blind)."""
        probe = self.plugins[stage].probe_payload()
        if probe is None:
            return
        try:
            self.status[stage].timings[device_id] = self._time(stage, device_id, probe)
        except Exception as err:  # the first request will measure it instead
            logger.warning("stage %s: timing on %s failed: %s", stage, device_id, err)

    def _set_hints(self, stage: str) -> None:
        """Cost ``stage`` by its plugin's graphs (the one source of its numbers), and
        recompute where it can run."""
        plugin = self.plugins[stage]
        formats = plugin.formats or (GraphFormat.ONNX,)
        for variant in self.policy.spec.stages[stage].variants:
            hint = combined_hint(plugin.graphs(str(variant), formats[0]))
            with self._lock:
                self.scheduler.set_hint(stage, str(variant), hint)
        for device in self.fleet.devices:
            self._fit_device(stage, device.id)

    def _fit_device(self, stage: str, device_id: str) -> None:
        """Tell the scheduler how ``stage`` runs on ``device_id`` when that differs from its
        hint: runs at once (an engine with continuous batching) and the memory its graphs in
        that device's format hold (an engine's KV cache)."""
        graph_format = self.format_for(stage, device_id)
        plugin = self.plugins[stage]
        if graph_format is None or not plugin.formats:
            return
        backend = self.backends[self._device_by_id[device_id].backend]
        slots = backend.run_slots(device_id, graph_format)
        resident = None
        if graph_format is not plugin.formats[0]:
            resident = combined_hint(plugin.graphs("full", graph_format)).resident_bytes
        if slots != 1 or resident is not None:
            with self._lock:
                self.scheduler.set_device_fit(
                    stage, device_id, slots=slots, resident_bytes=resident
                )

    def _time(self, stage: str, device_id: str, probe: Any) -> float:
        """Load ``stage`` on ``device_id``, run the probe (the first run pays for lazy
        initialisation), and feed the best of the timed runs to the cost model."""
        plugin = self.plugins[stage]
        key = f"{stage}/full"
        graph_format = self.format_for(stage, device_id)
        assert graph_format is not None
        host, threads = self.models[device_id], self._threads.get(stage, 0)
        samples = []
        for run in range(PROBE_RUNS + 1):
            ran = host.run_batch(plugin, key, graph_format, threads, [probe])
            (result,) = ran.results
            if isinstance(result, BaseException):
                raise result
            if run:
                samples.append(ran.run_s)  # timed where it ran, as the lanes time batches
        seconds = min(samples)
        units = self._units(self._profile(stage, probe))
        with self._lock:
            self.scheduler.calibrate(stage, device_id, seconds, plugin.items(probe))
            self.status[stage].pace("full").seed(seconds, plugin.items(probe), units)
        return seconds

    def _preload(self, stage: str, device_id: str) -> None:
        """Make ``stage`` resident on ``device_id`` if its memory allows (a warm start never
        evicts); otherwise the first request loads it."""
        key = f"{stage}/full"
        with self._lock:
            fits = self.scheduler.preload(device_id, key)
        if not fits:
            logger.info("stage %s: not preloaded on %s (memory budget)", stage, device_id)
            self.models[device_id].evict(key)
            return
        graph_format = self.format_for(stage, device_id)
        assert graph_format is not None
        self.models[device_id].load(
            self.plugins[stage], key, graph_format, self._threads.get(stage, 0)
        )
        self.metrics.loads.labels(stage, device_id).inc()

    def close(self) -> None:
        """Stop accepting work, fail what is still queued, stop the lanes, unload models."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        self._wake_membership.set()
        if self._started:
            self._dispatcher.join()
            if self._heartbeat.is_alive():
                self._heartbeat.join()
        with self._lanes_lock:
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.stop()
        with self._lock:
            pending = list(self._requests.values())
            for state in pending:
                self._end(state)
        for state in pending:
            _settle(state.future, error=ShedError("engine is shutting down", status=503))
        for models in self.models.values():
            models.close()
        for plugin in self.plugins.values():
            plugin.close()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- requests ------------------------------------------------------------------------------

    def use_policy(self, policy: Policy) -> None:
        """Judge requests submitted from now on by ``policy`` (deadlines, retry and degrade
        settings); its stages and pipelines must be those the engine was built with (the
        stages :meth:`add_stage` took in are kept)."""
        self.policy = policy.with_stages(self._added)
        self.admission.policy = self.policy

    # --- model versions side by side -----------------------------------------------------------

    def add_stage(
        self, name: str, config: StageConfig, plugin: StagePlugin, *, like: str | None = None
    ) -> None:
        """Take in a stage beside the running ones (a new model version, loaded while the old
        one serves): queued, placed, loaded, batched and metered like the stages the engine
        started with, with the threads, runtime pin and CPU priority of stage ``like``.
        :meth:`warm_up` it next; :meth:`remove_stage` unloads it."""
        with self._lock:
            if name in self.status or name in self.scheduler.queues:
                raise ValueError(f"stage {name!r} is already known to the engine")
            if like is not None:
                _copy_setting(self._threads, like, name)
                _copy_setting(self._pinned, like, name)
                _copy_setting(self._nice, like, name)
            self._added[name] = config
            self.policy = self.policy.with_stages({name: config})
            self.admission.policy = self.policy
            self.scheduler.add_stage(name, self.scheduler.policy.with_stages({name: config}))
            self.plugins[name] = plugin
            self.status[name] = StageStatus()
            self._running[name] = self._running_items[name] = 0
            self._running_units[name] = 0.0
        self.metrics.queue_depth.labels(name).set_function(lambda: self.scheduler.queued(name))
        for device in self.fleet.devices:
            self.metrics.loads.labels(name, device.id)
            self.metrics.evictions.labels(name, device.id)
            self.metrics.breaker_state.labels(name, device.id).set(0)

    def hold_config(self, name: str, config: StageConfig) -> None:
        """Keep ``config`` for stage ``name`` whatever later policies say of it: a model
        version being replaced runs by its own config until :meth:`remove_stage`."""
        with self._lock:
            self._added[name] = config
            self.policy = self.policy.with_stages({name: config})
            self.admission.policy = self.policy

    def busy(self, name: str) -> bool:
        """Whether ``name`` has tasks queued or running."""
        with self._lock:
            return bool(self.scheduler.queued(name) or self._running.get(name, 0))

    def remove_stage(self, name: str) -> None:
        """Unload a stage that has no work left (the old model version once drained, or a new
        one rolled back): its models leave every device, its lanes stop, its plugin closes;
        a request naming it from now on is an unknown stage.

        Raises:
            RuntimeError: it still has tasks queued or running.
        """
        with self._lock:
            if self.scheduler.queued(name) or self._running.get(name, 0):
                raise RuntimeError(f"stage {name!r} still has work queued or running")
            plugin = self.plugins.pop(name)
            self._single.pop(name, None)
            self._added.pop(name, None)
            keys = [f"{name}/{variant}" for variant in self.policy.spec.stages[name].variants]
            for index, device in enumerate(self.fleet.devices):
                for key in keys:
                    if key in self.scheduler.memory[index].resident:
                        self.scheduler.release(device.id, key)
                        self.metrics.evictions.labels(name, device.id).inc()
            self.status[name].state = "unloaded"
        with self._lanes_lock:
            lanes = [self._lanes.pop(key) for key in list(self._lanes) if key[0] == name]
        for lane in lanes:
            lane.stop()
        for models in self.models.values():
            for key in keys:
                models.evict(key)
        plugin.close()

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
        spec = self.policy.spec
        if route not in spec.routes:
            raise UnknownRouteError(route, tuple(sorted(spec.routes)))
        pipeline = self.policy.pipeline_for_route(route)
        payload = {name: np.asarray(value) for name, value in payload.items()}
        return self._submit(route, pipeline, payload, qos_class, profile, principal, None, None)

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
        records."""
        pipeline = self._single.get(stage)
        if pipeline is None:
            if stage not in self.plugins:
                raise UnknownRouteError(stage, tuple(sorted(self.plugins)))
            pipeline = self._single[stage] = Pipeline(stage, {stage: PipelineStep(stage)})
        if profile is None:  # the plugin measures it, cheaply (its pace is kept per unit)
            profile = self._profile(stage, payload)
        return self._submit(
            stage, pipeline, payload, qos_class, profile, principal, variant, request_id
        )

    def submit_graph(self, graph: RequestGraph) -> Future[EngineResult]:
        """Start a request graph; its future holds the outputs of the steps marked
        ``answer`` (masked for the principal where a stage touches a partition), where each
        step ran and which the feature cache answered. Cancelling the future cancels the
        request.

        In order: access checks for every step that touches a partition; the feature cache
        for first steps with a key (a request answered whole by the cache is never queued);
        admission of every other step (its variant, the class's deadline behind the queue,
        the principal's fair share of each stage); then every step whose inputs are ready is
        queued, the others as their dependencies finish.

        Raises:
            UnknownRouteError: a step names a stage the engine does not run.
            PermissionError: a step touches a partition and the gate refused; nothing queued.
            ShedError: admission refused it (429 with ``retry_after_s``) or the engine is
                shutting down (503).
            KeyError: unknown QoS class.
        """
        nodes = graph.nodes
        for node in nodes.values():
            if node.stage not in self.plugins:
                raise UnknownRouteError(node.stage, tuple(sorted(self.plugins)))
        pipeline = Pipeline(
            graph.name, {step: PipelineStep(node.stage, node.after) for step, node in nodes.items()}
        )
        spec = self.policy.spec
        qos = graph.qos_class or spec.qos.default_class
        if qos not in spec.qos.classes:
            classes = ", ".join(sorted(spec.qos.classes))
            raise KeyError(f"unknown QoS class {qos!r} (classes: {classes})")
        deadline_s = spec.sla_tiers[spec.qos.classes[qos].sla_tier].deadline_ms / 1000.0
        number = next(_request_ids)
        request_id = f"{graph.request_id}:{number}" if graph.request_id else f"req-{number}"
        principal = graph.principal
        self._authorize(pipeline, graph.name, principal, request_id)
        if self._stopping:
            raise ShedError("engine is shutting down", status=503)
        hits = self._lookup(graph)
        variants: dict[str, str] = {}
        reasons: dict[str, str] = {}
        units = 0.0
        by_stage: dict[str, list[str]] = {}
        for step in pipeline.order:
            if step not in hits:
                by_stage.setdefault(nodes[step].stage, []).append(step)
        for stage, steps in by_stage.items():  # once per stage, for all its steps' items
            units = max(units, *(self._units(nodes[step].profile) for step in steps))
            if graph.variant is not None:
                variants.update(dict.fromkeys(steps, graph.variant))
                continue
            plugin = self.plugins[stage]
            items = sum(self._items(plugin, nodes[step]) for step in steps)
            profile = max(
                (nodes[step].profile for step in steps),
                key=self._units,
            )
            variant, reason = self.admit(stage, qos, profile, items=items, principal=principal)
            variants.update(dict.fromkeys(steps, variant))
            reasons.update(dict.fromkeys(steps, reason))
        now = self.clock.now()
        future: Future[EngineResult] = Future()
        state = RequestState(
            request_id=request_id,
            route=graph.name,
            pipeline=pipeline,
            payload=None,
            qos_class=qos,
            variant=graph.variant or "full",
            arrival=now,
            deadline=now + deadline_s,
            future=future,
            units=units,
            principal=principal,
            variants=variants,
            reasons=reasons,
            step_units={step: self._units(node.profile) for step, node in nodes.items()},
            payloads={s: n.payload for s, n in nodes.items() if n.compose is None},
            composers={s: n.compose for s, n in nodes.items() if n.compose is not None},
            answer=tuple(step for step in pipeline.order if nodes[step].answer),
        )
        for step, (value, tier) in hits.items():
            state.outputs[step] = OutputHandle(CACHE_DEVICE, value, nbytes_of(value))
            state.devices[step] = CACHE_DEVICE
            state.cached[step] = tier
        for step, variant in variants.items():
            key_of = nodes[step].cache_key
            if key_of is not None and self.features is not None:
                state.keys[step] = key_of(variant)
        return self._start(state, principal)

    @staticmethod
    def _items(plugin: StagePlugin, node: GraphNode) -> int:
        if node.items is not None:
            return node.items
        return plugin.items(node.payload) if node.payload is not None else 1

    def _lookup(self, graph: RequestGraph) -> dict[str, tuple[Any, str]]:
        """First steps the feature cache answers, by step: (value, tier)."""
        hits: dict[str, tuple[Any, str]] = {}
        if self.features is None or graph.variant not in (None, "full"):
            return hits
        for step, node in graph.nodes.items():
            if node.cache_key is None or node.after:
                continue
            try:
                value, tier = self.features.lookup(node.stage, node.cache_key("full"))
            except Exception as err:  # the cache never fails a request: a miss
                logger.warning("cache lookup for %s failed: %s", node.stage, err)
                continue
            if value is not None and tier is not None:
                hits[step] = (value, tier)
        return hits

    def _start(
        self, state: RequestState, principal: Any, shares: tuple[str, ...] | None = None
    ) -> Future[EngineResult]:
        """Register a request and queue its ready steps; answered at once when nothing is
        left to run. The principal holds a share of each stage in ``shares`` (by default of
        every stage admission judged) until the request ends."""
        future = state.future
        who = getattr(principal, "name", None)
        if shares is None:
            shares = tuple(
                dict.fromkeys(state.pipeline.steps[step].stage for step in state.variants)
            )
        with self._lock:
            if self._stopping:
                raise ShedError("engine is shutting down", status=503)
            self._requests[state.request_id] = state
            if who is not None:
                for stage in shares:
                    state.holders.append((stage, str(who)))
                    self._shares.hold(stage, str(who))
            try:
                self._enqueue_ready(state)
            except ShedError as err:
                self._end(state)
                stage = state.pipeline.steps[state.pipeline.order[0]].stage
                self.metrics.shed.labels(stage, "queue_full").inc()
                self.metrics.outcomes.labels(state.route, "shed").inc()
                if isinstance(err, QueueFullError):
                    err.retry_after_s = max(
                        self.policy.spec.server.retry_after_s, self._queue_delay_s(stage)
                    )
                raise
            answered = state.done()  # every step came from the cache
            if answered:
                self._end(state)
        if answered:
            self.metrics.outcomes.labels(state.route, "ok").inc()
            future.set_result(self._result(state))
            return future
        future.add_done_callback(lambda done: self._caller_cancelled(done, state.request_id))
        self._kick()
        return future

    def _profile(self, stage: str, payload: Any) -> RequestProfile | None:
        try:
            return self.plugins[stage].profile(payload)
        except Exception as err:  # a payload it cannot measure is judged by the run itself
            logger.debug("stage %s: no profile: %s", stage, err)
            return None

    def admit(
        self,
        stage: str,
        qos_class: str | None,
        profile: RequestProfile | None,
        *,
        items: int = 1,
        principal: Any = None,
    ) -> tuple[str, str]:
        """The variant a request of ``stage`` runs (``full``, or ``light`` with the reason).

        The request (``items`` inputs, ``profile`` if stated) is estimated at the stage's
        measured pace and judged against its class's deadline behind the work queued; a named
        ``principal`` must also be within its fair share of the stage's queue.

        Raises:
            ShedError: (429, with Retry-After) it cannot finish by its deadline behind the
                queue, or its principal already holds its share of the stage.
        """
        qos = qos_class or self.policy.spec.qos.default_class
        units = self._units(profile)
        with self._lock:
            self._check_share(stage, qos, principal)
            status = self.status.get(stage)
            variants = self.policy.spec.stages[stage].variants
            run_s = light_s = None
            if status is not None:
                run_s = status.pace("full").estimate_s(items, units)
                if "light" in variants:
                    light_s = status.pace("light").estimate_s(items, units)
            try:
                result = self.admission.decide(
                    stage,
                    qos,
                    run_s=run_s,
                    light_run_s=light_s,
                    depth=self.scheduler.queued(stage) + self._running.get(stage, 0),
                    queue_delay_s=self._queue_delay_s(stage),
                )
            except ShedError:
                self.metrics.shed.labels(stage, "complexity").inc()
                raise
        if result.variant == "light":
            self.metrics.degraded.labels(stage, result.cause).inc()
            if stage in self.status:
                self.status[stage].light_runs += 1
        return result.variant, result.reason

    def max_batch(self, stage: str, variant: str = "full") -> int:
        """The most items one model call of a stage variant takes."""
        with self._lock:
            return self.scheduler.batching_for(f"{stage}/{variant}")[0]

    def _units(self, profile: RequestProfile | None) -> float:
        weights = self.policy.spec.circuit_breaker.complexity
        return profile.score(weights) if profile is not None else 0.0

    def _check_share(self, stage: str, qos: str, principal: Any) -> None:
        """:class:`ShedError` (429) when ``principal`` holds its share of ``stage`` (lock
        held)."""
        who = getattr(principal, "name", None)
        if who is None:
            return
        bound = self.policy.spec.qos.classes[qos].queue_bound
        held, share = self._shares.held(stage, who), self._shares.share(stage, who, bound)
        if held >= share:
            self.metrics.shed.labels(stage, "fair_share").inc()
            pace = self.status[stage].pace("full").item_s if stage in self.status else 0.0
            raise ShedError(
                f"{who} already has {held} requests of stage {stage!r} waiting or running, its"
                f" share of the {qos!r} queue while others use it",
                status=429,
                retry_after_s=max(self.policy.spec.server.retry_after_s, held * pace),
            )

    def _queue_delay_s(self, stage: str) -> float:
        """How long a new task of ``stage`` waits: the work queued and running, at the
        measured pace, by items and by complexity units, whichever says longer (generations
        of 4 and of 400 tokens are one item each; units tell them apart), over the runs a
        device takes at once (lock held)."""
        status = self.status.get(stage)
        if status is None:
            return 0.0
        pace = status.pace("full")
        items = self.scheduler.queued_items(stage) + self._running_items.get(stage, 0)
        units = self.scheduler.queued_units(stage) + self._running_units.get(stage, 0.0)
        return max(items * pace.item_s, units * pace.unit_s) / self.scheduler.run_slots(stage)

    def retry_after_s(self, stage: str) -> float:
        """When a refused caller should try again: the stage's queue at its measured pace."""
        with self._lock:
            delay = self._queue_delay_s(stage)
        return max(self.policy.spec.server.retry_after_s, delay)

    def _submit(
        self,
        route: str,
        pipeline: Pipeline,
        payload: Any,
        qos_class: str | None,
        profile: RequestProfile | None,
        principal: Any,
        variant: str | None,
        caller_id: str | None,
    ) -> Future[EngineResult]:
        spec = self.policy.spec
        qos = qos_class or spec.qos.default_class
        if qos not in spec.qos.classes:
            classes = ", ".join(sorted(spec.qos.classes))
            raise KeyError(f"unknown QoS class {qos!r} (classes: {classes})")
        deadline_s = spec.sla_tiers[spec.qos.classes[qos].sla_tier].deadline_ms / 1000.0
        number = next(_request_ids)
        request_id = f"{caller_id}:{number}" if caller_id else f"req-{number}"
        self._authorize(pipeline, route, principal, request_id)
        if self._stopping:
            raise ShedError("engine is shutting down", status=503)
        first = pipeline.steps[pipeline.order[0]].stage
        if variant is None:
            plugin = self.plugins.get(first)
            items = plugin.items(payload) if plugin is not None else 1
            variant, _ = self.admit(first, qos, profile, items=items, principal=principal)
        now = self.clock.now()
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
            units=self._units(profile),
            principal=principal,
        )
        return self._start(state, principal, (first,))

    def _authorize(self, pipeline: Pipeline, route: str, principal: Any, request_id: str) -> None:
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
        self.metrics.outcomes.labels(state.route, "cancelled").inc()
        return True

    def _caller_cancelled(self, future: Future[EngineResult], request_id: str) -> None:
        if future.cancelled():
            self.cancel(request_id)

    def _end(self, state: RequestState) -> None:
        """Forget a request that ended and drop its queued steps (lock held)."""
        if self._requests.pop(state.request_id, None) is not None:
            for holder in state.holders:
                self._shares.release(*holder)
        for task in state.live_tasks.values():
            self.scheduler.cancel(task)
        state.live_tasks.clear()

    # --- the loop ------------------------------------------------------------------------------

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
                variant = state.variants.get(step) or (
                    state.variant if state.variant in stages[stage].variants else "full"
                )
                cached = self._cached(state, step, stage, variant)
                if cached is not None:
                    size = sum(int(np.asarray(v).nbytes) for v in cached.values())
                    state.outputs[step] = OutputHandle(CACHE_DEVICE, cached, size)
                    state.devices[step] = CACHE_DEVICE
                    progressed = True
                    continue
                inputs = self._step_inputs(state, step)
                plugin = self.plugins.get(stage)  # none: placement rejects it, with reasons
                task = StageTask(
                    request_id=state.request_id,
                    stage=stage,
                    step=step,
                    variant=variant,
                    qos_class=state.qos_class,
                    arrival=state.arrival,
                    deadline=state.deadline,
                    inputs=tuple(state.outputs[dep] for dep in state.pipeline.steps[step].after),
                    items=plugin.items(inputs) if plugin is not None else 1,
                    units=state.step_units.get(step, state.units),
                    enqueued_at=now,
                )
                self.scheduler.enqueue(task)
                state.live_tasks[task.id] = task

    def _step_inputs(self, state: RequestState, step: str) -> Any:
        """A step's payload: the request's for a first step; for a bare graph after others,
        its dependencies' output arrays merged and filtered to the graph's input names; for a
        plugin after others, the dependencies' outputs by step."""
        if step in state.payloads:
            return state.payloads[step]
        compose = state.composers.pop(step, None)
        if compose is not None:  # once, when its dependencies are done
            done = {
                dep: self._fetched(state.outputs[dep].value)
                for dep in state.pipeline.after_of[step]
            }
            state.payloads[step] = compose(done)
            return state.payloads[step]
        deps = state.pipeline.steps[step].after
        payload = {dep: state.outputs[dep].value for dep in deps} if deps else state.payload
        plugin = self.plugins.get(state.pipeline.steps[step].stage)
        if not isinstance(plugin, GraphStage):
            return payload
        arrays: dict[str, Any] = dict(payload) if not deps else {}
        for dep in deps:
            arrays.update(state.outputs[dep].value)
        names = plugin.graphs(state.variant)["main"].input_names
        return {n: arrays[n] for n in names if n in arrays} if names else arrays

    def _cache_identity(self, stage: str, variant: str) -> tuple[str, str, str, str | None]:
        config = self.policy.spec.stages[stage]
        return stage, config.model_version, variant, config.partition

    def _cached(self, state: RequestState, step: str, stage: str, variant: str) -> Any:
        if self.cache is None or not isinstance(self.plugins.get(stage), GraphStage):
            return None
        try:
            inputs = self._fetched(self._step_inputs(state, step))
            return self.cache.get_outputs(*self._cache_identity(stage, variant), inputs)
        except Exception as err:  # the cache never fails a request: a miss
            logger.warning("cache lookup for %s failed: %s", stage, err)
            return None

    def _offer(self, task: StageTask, inputs: Any, outputs: Any, key: Any = None) -> None:
        if key is not None and self.features is not None:
            try:
                self.features.put(task.stage, key, self._fetched(outputs))
            except Exception as err:  # the cache never fails a request
                logger.warning("caching %s failed: %s", task.stage, err)
            return
        if self.cache is None or not isinstance(self.plugins[task.stage], GraphStage):
            return
        try:
            self.cache.put_outputs(
                *self._cache_identity(task.stage, task.variant),
                self._fetched(inputs),
                self._fetched(outputs),
            )
        except Exception as err:
            logger.warning("caching %s failed: %s", task.stage, err)

    def _kick(self) -> None:
        """Place what can go now, on this thread: a new task or a freed device is dispatched
        without a hand-off to the dispatcher thread (which only retries on a timer)."""
        if self._stopping or not self._started:
            self._wake.set()
            return
        try:
            self._dispatch_ready()
        except Exception:  # a bug here must not fail the caller's request or the lane
            logger.exception("dispatch failed unexpectedly")
            self._wake.set()

    def _dispatch_loop(self) -> None:
        while not self._stopping:
            self._wake.wait(timeout=DISPATCH_POLL_S)
            self._wake.clear()
            try:
                self._dispatch_ready()
            except Exception:  # a bug here must not stop dispatching for everyone
                logger.exception("dispatch failed unexpectedly")

    def _membership_loop(self) -> None:
        """Ask backends whose devices come and go (a Ray cluster's nodes) every
        ``cluster.heartbeat_s``: devices that joined are taken in, those that left leave
        placement, without anyone calling :meth:`add_devices`."""
        while not self._wake_membership.wait(timeout=self.policy.spec.cluster.heartbeat_s):
            self._poll_membership()  # the event is set only when closing

    def _poll_membership(self) -> None:
        for backend in list(self.backends.values()):
            if not backend.supports_membership:
                continue
            try:
                joined = backend.poll_membership()
            except Exception:  # a heartbeat that fails is tried again on the next beat
                logger.exception("%s: polling membership failed", backend.name)
                continue
            if joined:
                logger.info("%d devices joined: %s", len(joined), [d.id for d in joined])
                self.add_devices(joined)
        self._sync_health()
        self._kick()

    def _dispatch_ready(self) -> None:
        outcomes: list[Dispatch | Rejection] = []
        with self._lock:
            while (outcome := self.scheduler.dispatch()) is not None:
                outcomes.append(outcome)
                if isinstance(outcome, Dispatch):
                    self._running[outcome.task.stage] += 1
                    self._running_items[outcome.task.stage] += outcome.task.items
                    self._running_units[outcome.task.stage] += outcome.task.units
        for outcome in outcomes:
            if isinstance(outcome, Rejection):
                self._fail(outcome.task.request_id, outcome.error)
                continue
            stage, device_id = outcome.task.stage, outcome.device_id
            self.metrics.placements.labels(stage, device_id).inc()
            if outcome.load.load:
                self.metrics.loads.labels(stage, device_id).inc()
            for victim in outcome.load.evict:
                self.metrics.evictions.labels(victim.split("/", 1)[0], device_id).inc()
            self._lane(stage, device_id).inbox.put(outcome)

    def _lane(self, stage: str, device_id: str) -> Lane:
        with self._lanes_lock:
            lane = self._lanes.get((stage, device_id))
            if lane is None:
                graph_format = self.format_for(stage, device_id)
                assert graph_format is not None, "the scheduler placed where it cannot run"
                lane = Lane(
                    stage,
                    self.plugins[stage],
                    graph_format,
                    self.models[device_id],
                    self._threads.get(stage, 0),
                    self._inputs,
                    self.scheduler.batching_for,
                    self._on_batch,
                    nice=self._nice.get(stage, 0),
                    slots=self.backends[self._device_by_id[device_id].backend].run_slots(
                        device_id, graph_format
                    ),
                )
                self._lanes[(stage, device_id)] = lane
            return lane

    def _inputs(self, dispatch: Dispatch) -> tuple[bool, Any]:
        """A task's payload; (False, None) when its request is gone (cancelled, timed out)."""
        task = dispatch.task
        with self._lock:
            state = self._requests.get(task.request_id)
            if state is None or task.cancelled:
                return False, None
            return True, self._step_inputs(state, task.step)

    def _on_batch(self, outcomes: list[BatchOutcome]) -> None:
        self._sync_health()
        self._observe_batch([o for o in outcomes if not o.skipped and o.batch_size])
        for outcome in outcomes:
            self._finish(outcome)
        self._kick()

    def _observe_batch(self, ran: list[BatchOutcome]) -> None:
        if not ran:
            return
        first = ran[0]
        device_id = first.dispatch.device_id
        stage = first.dispatch.task.stage
        variant = first.dispatch.model_key.split("/", 1)[1]
        self.metrics.batch_size.labels(stage).observe(first.batch_size)
        self.metrics.stage_duration.labels(stage, device_id, variant).observe(first.run_s)
        self.metrics.device_busy.labels(device_id).inc(first.run_s)
        status = self.status.get(stage)
        if status is not None:
            status.batches += 1
            items = sum(o.dispatch.task.items for o in ran) or 1
            status.recent_s.append(first.run_s / items)
            units = sum(o.dispatch.task.units for o in ran)
            status.pace(variant).observe(first.run_s, items, units)

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
        device_id = dispatch.device_id
        with self._lock:
            self._running[task.stage] = max(0, self._running[task.stage] - 1)
            self._running_items[task.stage] = max(0, self._running_items[task.stage] - task.items)
            self._running_units[task.stage] = max(0.0, self._running_units[task.stage] - task.units)
        if outcome.skipped:
            with self._lock:
                self.scheduler.completed(dispatch, ok=True, run_s=0.0, judge=False)
            return
        device_fault = outcome.error is not None and outcome.blame
        self.metrics.queue_wait.labels(task.stage, task.qos_class).observe(
            max(0.0, outcome.started_at - task.enqueued_at)
        )
        with self._lock:
            if device_fault and not self.models[device_id].resident(dispatch.model_key):
                self.scheduler.unloaded(device_id, dispatch.model_key)  # its load failed
            self.scheduler.completed(
                dispatch,
                ok=not device_fault,
                run_s=outcome.run_s if not device_fault else 0.0,
                batch_size=outcome.batch_size,
                judge=not isinstance(outcome.error, InputLostError),  # nothing ran to judge
            )
            breaker = self.scheduler.breaker(task.stage, device_id)
            self.metrics.breaker_state.labels(task.stage, device_id).set(
                0 if breaker.state is BreakerState.CLOSED else 1
            )
            state = self._requests.get(task.request_id)
            if state is None:
                return  # cancelled or timed out meanwhile
            state.live_tasks.pop(task.id, None)
            offered = None
            key = state.keys.get(task.step)
            error: BaseException | None = None
            if outcome.error is None:
                offered = None if key is not None else self._step_inputs(state, task.step)
                state.outputs[task.step] = OutputHandle(
                    device_id, outcome.output, nbytes_of(outcome.output)
                )
                state.devices[task.step] = device_id
                state.steps.append(_step_trace(outcome))
                error = None if state.done() else self._continue(state)
            elif isinstance(outcome.error, InputLostError):
                error = self._redo_inputs(state, task, outcome.error)
            elif device_fault:
                error = self._retry(state, task, device_id, outcome.error)
            else:
                error = outcome.error  # the item itself was bad: no other device would help
            finished = error is not None or state.done()
            if finished:
                self._end(state)
        if offered is not None or (key is not None and outcome.error is None):
            self._offer(task, offered, outcome.output, key)  # outside the lock: it does I/O
        if not finished:
            return
        self._answer(state, error)

    def _answer(self, state: RequestState, error: BaseException | None) -> None:
        """Settle a finished request's future: its error, or its outputs fetched."""
        if error is None:
            try:
                result = self._result(state)
            except Exception as err:  # a final output that could not be fetched (its node
                # left, its keeper dropped it): the request fails with that, the lane lives on
                logger.warning("request %s: outputs not fetched: %s", state.request_id, err)
                error = err
        if error is not None:
            self.metrics.outcomes.labels(state.route, "failed").inc()
            _settle(state.future, error=error)
            return
        self.metrics.outcomes.labels(state.route, "ok").inc()
        _settle(state.future, result=result)

    def _result(self, state: RequestState) -> EngineResult:
        stages = self.policy.spec.stages
        had_light = any(
            "light" in stages[step.stage].variants for step in state.pipeline.steps.values()
        )
        answer = state.answer if state.answer is not None else state.pipeline.sinks
        return EngineResult(
            request_id=state.request_id,
            outputs={step: self._answered(state, step) for step in answer},
            devices=dict(state.devices),
            degraded=(state.variant == "light" and had_light)
            or any(v == "light" for v in state.variants.values()),
            latency_s=self.clock.now() - state.arrival,
            variant=state.variant,
            steps=tuple(state.steps),
            cached=dict(state.cached),
            variants=dict(state.variants),
            reasons=dict(state.reasons),
        )

    def _answered(self, state: RequestState, step: str) -> Any:
        """A step's output fetched to the caller, masked for the caller's role where its
        stage touches a partition."""
        value = self._fetched(state.outputs[step].value)
        stage = state.pipeline.steps[step].stage
        if self.gate is not None and self.policy.spec.stages[stage].partition is not None:
            return self.gate.mask(state.principal, stage, value)
        return value

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

    def _redo_inputs(
        self, state: RequestState, task: StageTask, error: InputLostError
    ) -> BaseException | None:
        """Run again the steps whose outputs ``task`` could not read (lock held): they were
        kept on a node that left. The task itself is queued again once they are done."""
        gone = set(error.devices)
        lost = [
            dep
            for dep in state.pipeline.steps[task.step].after
            if state.outputs[dep].device_id in gone
            or not self._healthy(state.outputs[dep].device_id)
        ]
        if not lost:
            return error  # nothing to redo: the request cannot go on
        if state.redos >= MAX_INPUT_REDOS:
            logger.warning(
                "%s: %s lost its inputs again (%s) after %d redos: failing it",
                task.request_id,
                task.step,
                error.reason,
                state.redos,
            )
            return error
        state.redos += 1
        logger.warning(
            "%s: %s lost its inputs (%s): redoing %s",
            task.request_id,
            task.step,
            error.reason,
            lost,
        )
        self.metrics.retries.labels(task.stage).inc()
        for dep in lost:
            del state.outputs[dep]
            state.devices.pop(dep, None)
        return self._continue(state)

    def _healthy(self, device_id: str) -> bool:
        index = self.scheduler.fleet.index.get(device_id)
        return index is None or bool(self.scheduler.healthy[index])

    def _fail(self, request_id: str, error: BaseException) -> None:
        with self._lock:
            state = self._requests.get(request_id)
            if state is None:
                return
            self._end(state)
        self.metrics.outcomes.labels(state.route, "failed").inc()
        _settle(state.future, error=error)

    # --- a fleet that grows ----------------------------------------------------------------------

    def add_devices(self, devices: tuple[DeviceSpec, ...] | list[DeviceSpec]) -> None:
        """Take in devices that joined while running (a Ray node's): the scheduler places on
        them from now on; their backend must be one the engine already runs (``ray``)."""
        fresh = [d for d in devices if d.id not in self._device_by_id]
        if not fresh:
            return
        for device in fresh:
            self._device_by_id[device.id] = device
            self.models[device.id] = self._host(device)
        with self._lock:
            self.fleet = dataclasses.replace(self.fleet, devices=self.fleet.devices + tuple(fresh))
            self.scheduler.add_devices(fresh, self.fleet.topology())
        self._kick()

    # --- reporting -----------------------------------------------------------------------------

    def resident(self) -> dict[str, list[str]]:
        """Model keys resident per device, as the memory manager accounts them."""
        with self._lock:
            return {
                device.id: sorted(self.scheduler.memory[index].resident)
                for index, device in enumerate(self.fleet.devices)
            }


def _step_trace(outcome: BatchOutcome) -> StepTrace:
    dispatch = outcome.dispatch
    task = dispatch.task
    return StepTrace(
        step=task.step,
        stage=task.stage,
        device=dispatch.device_id,
        variant=task.variant,
        queued_at=task.enqueued_at,
        started_at=outcome.started_at,
        load_s=outcome.load_s,
        run_s=outcome.run_s,
        batch_size=outcome.batch_size,
        estimate_s=dispatch.estimate_s,
        loaded=dispatch.load.load,
    )


def _copy_setting(settings: dict[str, Any], source: str, target: str) -> None:
    if source in settings:
        settings[target] = settings[source]


def describe_failure(err: BaseException) -> str:
    """One line: what went wrong (hetero's errors carry the fix in their message)."""
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else ""
    if isinstance(err, HeteroError):
        return text or type(err).__name__
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _by_stage(graphs: Mapping[str, ComputeGraph]) -> dict[str, dict[str, ComputeGraph]]:
    out: dict[str, dict[str, ComputeGraph]] = {}
    for key, graph in graphs.items():
        stage, _, variant = key.partition("/")
        out.setdefault(stage, {})[variant or "full"] = graph
    return out


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
