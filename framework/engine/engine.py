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
import logging
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from hetero.framework.backend import Backend
from hetero.framework.devices import DeviceSpec
from hetero.framework.engine.admitting import Admitter
from hetero.framework.engine.device_models import DeviceModels, ModelHost
from hetero.framework.engine.dispatch import Dispatcher
from hetero.framework.engine.fills import CacheFills
from hetero.framework.engine.graph_runner import GraphRunner
from hetero.framework.engine.graph_stage import GraphStage
from hetero.framework.engine.lanes import Lane
from hetero.framework.engine.metrics import Metrics
from hetero.framework.engine.outcomes import Outcomes
from hetero.framework.engine.request_graph import FeatureStore, RequestGraph
from hetero.framework.engine.requests import EngineResult, RequestState, settle
from hetero.framework.engine.route_requests import RouteRequests
from hetero.framework.engine.stage_set import StageVersions
from hetero.framework.engine.status import (
    AccessGate,
    AccessRefusedError,
    Progress,
    StageStatus,
    describe_failure,
)
from hetero.framework.engine.version_routing import VersionRouter
from hetero.framework.engine.warmup import WarmUp
from hetero.framework.errors import (
    ShedError,
)
from hetero.framework.fleet import Fleet, backend_for, resolve_fleet
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.policy import Policy
from hetero.framework.policy.schema import StageConfig
from hetero.framework.registry import Registry
from hetero.framework.remote import materialize
from hetero.framework.scheduler import (
    RequestProfile,
    Scheduler,
    WallClock,
)
from hetero.framework.scheduler.kin import seed_from_kin
from hetero.framework.scheduler.request_admission import RequestAdmission
from hetero.framework.stage_cache import StageCache
from hetero.framework.stage_plugin import StagePlugin, combined_hint

__all__ = ["AccessGate", "AccessRefusedError", "Engine", "StageStatus", "describe_failure"]

logger = logging.getLogger(__name__)


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
        self.admitter = Admitter(self)
        self.warmer = WarmUp(self)
        self.versions = StageVersions(self)
        self.routing = VersionRouter()  # which model version answers each request
        self.fills = CacheFills(self)
        self.routes = RouteRequests(self)
        self.outcomes = Outcomes(self)
        self.dispatcher = Dispatcher(self)
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
        self.admission = RequestAdmission(policy, self.scheduler)
        self.runner = GraphRunner(self)  # its request walk asks the admission and scheduler
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._wake_membership = threading.Event()
        self._stopping = False
        self._requests: dict[str, RequestState] = {}
        self._added: dict[str, StageConfig] = {}  # stages taken in while running (add_stage)
        self._remote_outputs = False  # set by _host for a device whose models live elsewhere
        self.models: dict[str, ModelHost] = {d.id: self._host(d) for d in self.fleet.devices}
        self._lanes: dict[tuple[str, str], Lane] = {}
        self._lanes_lock = threading.Lock()
        self._dispatcher = threading.Thread(
            target=self.dispatcher.loop, name="hetero-dispatch", daemon=True
        )
        self._heartbeat = threading.Thread(
            target=self.dispatcher.membership_loop, name="hetero-membership", daemon=True
        )
        self._started = False
        self._start_series()

    def _start_series(self) -> None:
        """Gauges read from the scheduler; known series start at 0 (a dashboard sees "none
        yet", not nothing)."""
        for stage in self.policy.spec.stages:
            self.metrics.queue_depth.labels(stage).set_function(
                lambda s=stage: self.scheduler.queued(s)  # type: ignore[misc]
            )
        for index, device in enumerate(self.fleet.devices):
            self.metrics.resident_bytes.labels(device.id).set_function(
                lambda i=index: self.scheduler.memory[i].used  # type: ignore[misc]
            )
            for stage in self.plugins:
                self.metrics.loads.labels(stage, device.id)
                self.metrics.evictions.labels(stage, device.id)
                self.metrics.breaker_state.labels(stage, device.id).set(0)

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
                self.runner.end(state)
        for state in pending:
            settle(state.future, error=ShedError("engine is shutting down", status=503))
        for models in self.models.values():
            models.close()
        for plugin in self.plugins.values():
            plugin.close()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def use_policy(self, policy: Policy) -> None:
        """Judge requests submitted from now on by ``policy`` (deadlines, retry and degrade
        settings); its stages and pipelines must be those the engine was built with (the
        stages :meth:`add_stage` took in are kept)."""
        self.policy = policy.with_stages(self._added)
        self.admission.policy = self.policy

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
            seed_from_kin(self.scheduler, fresh)  # from what an identical device measured
        self.dispatcher.kick()

    def resident(self) -> dict[str, list[str]]:
        """Model keys resident per device, as the memory manager accounts them."""
        with self._lock:
            return {
                device.id: sorted(self.scheduler.memory[index].resident)
                for index, device in enumerate(self.fleet.devices)
            }

    # --- the parts' public face ------------------------------------------------------------

    def warm_up(
        self,
        stages: list[str] | None = None,
        progress: Progress | None = None,
        *,
        stop: threading.Event | None = None,
    ) -> dict[str, str]:
        """Prepare, set up, calibrate and place every plugin stage (or ``stages``), one after
        another; a stage that fails is recorded (``status[stage].reason``) and skipped.
        Returns the failures by stage (:class:`~hetero.framework.engine.warmup.WarmUp`)."""
        return self.warmer.run(stages, progress, stop=stop)

    def add_stage(
        self, name: str, config: StageConfig, plugin: StagePlugin, *, like: str | None = None
    ) -> None:
        """Take in a stage beside the running ones (a new model version, loaded while the old
        one serves), with the threads, runtime pin and CPU priority of stage ``like``;
        :meth:`warm_up` it next, :meth:`remove_stage` unloads it."""
        self.versions.add(name, config, plugin, like=like)

    def hold_config(self, name: str, config: StageConfig) -> None:
        """Keep ``config`` for stage ``name`` whatever later policies say of it, until
        :meth:`remove_stage`."""
        self.versions.hold_config(name, config)

    def remove_stage(self, name: str) -> None:
        """Unload a stage that has no work left (raises ``RuntimeError`` while it has)."""
        self.versions.remove(name)

    def submit_graph(self, graph: RequestGraph) -> Future[EngineResult]:
        """Start a request graph (:meth:`GraphRunner.submit_graph
        <hetero.framework.engine.graph_runner.GraphRunner.submit_graph>`): the one way a
        request runs; its future holds the answered steps' outputs."""
        return self.runner.submit_graph(graph)

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
        """Run one stage on one payload: a one-step :meth:`submit_graph`; the future's
        ``outputs[stage]`` is the plugin's result and ``devices[stage]`` where it ran."""
        return self.runner.submit_stage(
            stage,
            payload,
            qos_class=qos_class,
            profile=profile,
            principal=principal,
            variant=variant,
            request_id=request_id,
        )

    def submit(
        self,
        route: str,
        payload: Mapping[str, Any],
        *,
        qos_class: str | None = None,
        profile: RequestProfile | None = None,
        principal: Any = None,
    ) -> Future[EngineResult]:
        """Start a request on a policy route of bare-graph stages; its future holds the sink
        steps' outputs (raises as :meth:`submit_graph` does, and ``UnknownRouteError``)."""
        return self.routes.submit(
            route, payload, qos_class=qos_class, profile=profile, principal=principal
        )

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
        return self.routes.run(
            route, payload, timeout=timeout, qos_class=qos_class, profile=profile
        )

    def cancel(self, request_id: str) -> bool:
        """Cancel a request: queued steps are dropped, running ones finish and are ignored."""
        return self.runner.cancel(request_id)

    def admit(
        self,
        stage: str,
        qos_class: str | None,
        profile: RequestProfile | None,
        *,
        items: int = 1,
        principal: Any = None,
    ) -> tuple[str, str]:
        """The variant a request of ``stage`` runs (``full``, or ``light`` with the reason);
        ``ShedError`` (429) when it cannot finish by its deadline or its principal holds its
        share (:class:`~hetero.framework.engine.admitting.Admitter`)."""
        return self.admitter.admit(stage, qos_class, profile, items=items, principal=principal)

    def max_batch(self, stage: str, variant: str = "full") -> int:
        """The most items one model call of a stage variant takes."""
        return self.admitter.max_batch(stage, variant)

    def retry_after_s(self, stage: str) -> float:
        """When a refused caller should try again: the stage's queue at its measured pace."""
        return self.admitter.retry_after_s(stage)


def _by_stage(graphs: Mapping[str, ComputeGraph]) -> dict[str, dict[str, ComputeGraph]]:
    out: dict[str, dict[str, ComputeGraph]] = {}
    for key, graph in graphs.items():
        stage, _, variant = key.partition("/")
        out.setdefault(stage, {})[variant or "full"] = graph
    return out
