"""What the HTTP routes need from the engine: the policy's stages by kind, their versions, and
each request as one request graph (:mod:`~hetero.framework.server.graph_calls`).

:class:`Serving` builds the stage plugins (a sensitive stage's plugin comes from the sandbox
provider and is placed only on its partition's sandbox), then, in :meth:`start`, builds the
engine and warms every stage up (prepare, set up, calibrate each eligible device, place). It
runs no model and owns no queue or thread of its own: every model call is the engine's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hetero.cache.feature_cache import FeatureCache
from hetero.framework.engine import (
    AccessGate,
    Engine,
    Metrics,
    StageStatus,
)
from hetero.framework.errors import HeteroError
from hetero.framework.policy import Policy
from hetero.framework.policy.schema import PolicySpec, ServerConfig, ServerLimits
from hetero.framework.registry import Registry, default_registry
from hetero.framework.server.cache_adapter import CacheAdapter
from hetero.framework.server.errors import APIError
from hetero.framework.server.graph_calls import GraphCalls
from hetero.framework.server.ops_metrics import (
    CacheTierCollector,
    ClusterCollector,
    SandboxHealthCollector,
)
from hetero.framework.server.reload import pinned_policy
from hetero.framework.server.rollout import ModelVersions
from hetero.framework.server.served import ServedStage, StageRun
from hetero.framework.stage_plugin import StagePlugin, stage_kind, stage_plugins

__all__ = [
    "SandboxProvider",
    "ServedStage",
    "Serving",
    "StageFailure",
    "StageRun",
    "StagesFailedError",
]

logger = logging.getLogger(__name__)

Progress = Callable[[str, str], None]


class SandboxProvider(Protocol):
    """Gives the plugin that runs a sensitive stage inside its partition's sandbox, and the
    sandbox devices to place it on (``hetero.sandbox.serving.SandboxedStages``)."""

    def register_devices(self, registry: Registry) -> None:
        """Add the partitions' sandboxes to ``registry`` as devices."""
        ...

    def plugin(self, stage: str, kind: str) -> StagePlugin:
        """The sandboxed plugin of ``stage``; raises, saying what is missing, when the stage
        cannot be sandboxed here."""
        ...


@dataclass(frozen=True, slots=True)
class StageFailure:
    """Why a stage could not be served."""

    kind: str
    reason: str


class StagesFailedError(HeteroError):
    """Start-up asked for every stage and some could not load."""

    def __init__(self, failed: Mapping[str, StageFailure]) -> None:
        self.failed = dict(failed)
        super().__init__(f"stages that could not load: {', '.join(sorted(failed))}")


class Serving:
    """The policy's stages, served through one engine.

    Args:
        policy: The policy served.
        stage_models: {kind: plugin class}; by default the ``stage_model`` plugins.
        registry: Where backends and plugins are found (the process-wide one by default).
        gate: Access checks and masking for stages with a partition.
        sandboxes: Runs stages with a partition inside the partition's sandbox. Without it
            those stages are not served: sensitive media never reach an unsandboxed model.
        model_cache_dir: Where models keep derived artefacts.
        cache_directory: The feature cache's disk tier directory (the policy's by default).
        use_cache: Whether stage outputs are cached at all.
        probe_runtimes: Whether warm-up times every eligible device (calibration).
        require_all_stages: Fail start-up when any stage cannot load, instead of serving
            the others.
        metrics: Where to count (a fresh registry by default).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        stage_models: Mapping[str, Any] | None = None,
        registry: Registry | None = None,
        gate: AccessGate | None = None,
        sandboxes: SandboxProvider | None = None,
        model_cache_dir: Path | None = None,
        cache_directory: Path | None = None,
        use_cache: bool = True,
        probe_runtimes: bool = True,
        require_all_stages: bool = False,
        metrics: Metrics | None = None,
    ) -> None:
        self.current_policy = policy  # what a new request gets (swapped by a reload)
        self.gate = gate
        self.sandboxes = sandboxes
        self.metrics = metrics or Metrics()
        self.require_all_stages = require_all_stages
        self._registry = registry or default_registry()
        self._stage_models = dict(stage_models) if stage_models is not None else None
        self._model_cache_dir = model_cache_dir
        self._cache_directory = Path(cache_directory) if cache_directory is not None else None
        self._use_cache = use_cache
        self._probe = probe_runtimes
        self.cache: FeatureCache | None = None
        self.engine: Engine | None = None
        self.stages: dict[str, ServedStage] = {}  # the ready ones; swapped whole
        self.unserved: dict[str, str] = {}
        self.failed: dict[str, StageFailure] = {}
        self._planned: dict[str, ServedStage] = {}
        self._ready = threading.Event()
        self._loaded = threading.Event()
        self._closing = threading.Event()
        self._close_lock = threading.Lock()
        self.started_at = time.time()
        self.metrics.registry.register(SandboxHealthCollector(lambda: self.engine))
        self.metrics.registry.register(ClusterCollector(lambda: self.engine))
        self.load_s = 0.0
        self.versions = ModelVersions(self)
        self.calls = GraphCalls(self)

    # --- the policy ----------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        """The policy of the request being handled (pinned when it started), else the
        current one."""
        return pinned_policy() or self.current_policy

    @property
    def spec(self) -> PolicySpec:
        """:attr:`policy`'s spec."""
        return self.policy.spec

    @property
    def server(self) -> ServerConfig:
        """:attr:`policy`'s ``server`` section."""
        return self.policy.spec.server

    @property
    def limits(self) -> ServerLimits:
        """:attr:`policy`'s ``server.limits``."""
        return self.policy.spec.server.limits

    def use_policy(self, policy: Policy) -> None:
        """Serve new requests with ``policy`` (a reload checked that only per-request keys
        changed); requests in flight keep theirs."""
        self.current_policy = policy
        if self.engine is not None:
            self.engine.use_policy(policy)

    # --- start-up ------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether loading has ended and at least one stage serves."""
        return self._ready.is_set()

    @property
    def loading(self) -> bool:
        """Whether start-up is still loading models."""
        return not self._loaded.is_set()

    def plan(self) -> list[tuple[str, str]]:
        """(stage, kind) of every stage that has a model plugin, in policy order."""
        classes = self._classes()
        out = []
        for name, config in self.spec.stages.items():
            kind = stage_kind(name, config.model_version, classes)
            if kind is None or kind not in classes:
                self._unserve(name, "no model" if kind is None else f"no {kind} model plugin")
                continue
            out.append((name, kind))
        return out

    def _classes(self) -> dict[str, Any]:
        if self._stage_models is None:
            self._stage_models = stage_plugins(self._registry)
        return self._stage_models

    def stage_classes(self) -> dict[str, Any]:
        """{kind: plugin class} of the stage models this server builds stages from."""
        return dict(self._classes())

    @property
    def model_cache_dir(self) -> Path | None:
        """Where models keep derived artefacts."""
        return self._model_cache_dir

    def _unserve(self, name: str, reason: str) -> None:
        self.unserved = {**self.unserved, name: reason}

    def _plugin(self, name: str, kind: str) -> Any:
        """The plugin that runs stage ``name`` (None, with the reason in :attr:`unserved`,
        when a sensitive stage cannot be sandboxed: never an unsandboxed fallback)."""
        partition = self.spec.stages[name].partition
        if partition is None:
            return self._classes()[kind](cache_dir=self._model_cache_dir)
        if self.sandboxes is None:
            self._unserve(name, f"touches partition {partition!r} and no sandbox is configured")
            return None
        try:
            return self.sandboxes.plugin(name, kind)
        except Exception as err:
            self._unserve(name, f"partition {partition!r} cannot be sandboxed here: {err}")
            logger.warning("stage %s not served: %s", name, self.unserved[name])
            return None

    def start(self, progress: Progress | None = None) -> None:
        """Build the engine and warm every stage up; then the server is ready.

        A stage that cannot load is logged (one line: the stage, the cause and the fix where
        one is known), kept in :attr:`failed` and not served; the others are. With
        ``require_all_stages`` the first failure ends start-up with :class:`StagesFailedError`.
        """
        began = time.monotonic()
        report = progress or (lambda stage, message: None)
        if self._use_cache and self.spec.cache.enabled:
            self.cache = FeatureCache(self.spec.cache, directory=self._cache_directory)
            self.metrics.registry.register(CacheTierCollector(self.cache.metrics.registry))
        for name, kind in self.plan():
            plugin = self._plugin(name, kind)
            if plugin is not None:
                self._planned[name] = ServedStage(name, kind, self.spec.stages[name], plugin)
        if self.sandboxes is not None and any(s.sensitive for s in self._planned.values()):
            self.sandboxes.register_devices(self._registry)
        threads = {
            name: self.server.model_threads.get(name, self.server.threads_per_model)
            for name in self._planned
        }
        engine = self.engine = Engine(
            self.policy,
            self._registry,
            plugins={name: stage.plugin for name, stage in self._planned.items()},
            gate=self.gate,
            metrics=self.metrics,
            threads=threads,
            pinned=dict(self.server.runtimes),
            nice=dict(self.server.nice),
            probe=self._probe,
            features=CacheAdapter(self, self.cache) if self.cache is not None else None,
        ).start()
        if self._closing.is_set():  # closed while the engine was being built
            engine.close()
            return
        for name in self._planned:
            if self._closing.is_set():
                break
            engine.warm_up([name], report, stop=self._closing)
            status = engine.status[name]
            if status.state == "ready":
                self.stages = {**self.stages, name: self._planned[name]}
                continue
            failure = StageFailure(self._planned[name].kind, status.reason)
            self.failed = {**self.failed, name: failure}
            if self.require_all_stages:  # release what loaded, then fail start-up
                self.stages = {}
                self.close()
                raise StagesFailedError(self.failed)
        self.load_s = time.monotonic() - began
        self._loaded.set()
        if self.stages and not self._closing.is_set():
            self.metrics.ready.set(1)
            self._ready.set()
        logger.info(
            "serving %d stages in %.1f s: %s",
            len(self.stages),
            self.load_s,
            ", ".join(f"{name}={self.placed_on(name)}" for name in self.stages),
        )

    def close(self) -> None:
        """Stop the engine (running generations are asked to stop) and release the models;
        a :meth:`start` still loading in another thread stops after its current stage."""
        self._closing.set()
        self._ready.clear()
        self.metrics.ready.set(0)
        with self._close_lock:
            engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()
        close_gate = getattr(self.gate, "close", None)
        if close_gate is not None:  # the audit log's final checkpoint, after sandbox_stop
            close_gate()
        if self.cache is not None:
            self.cache.close()

    # --- state ---------------------------------------------------------------------------

    def stage_states(self) -> dict[str, dict[str, str]]:
        """Per policy stage: ``state`` (waiting, loading, ready, failed, unserved) and why."""
        engine = self.engine
        states: dict[str, dict[str, str]] = {}
        for name in self.spec.stages:
            if name in self.stages:
                states[name] = {"state": "ready", "device": self.placed_on(name)}
            elif name in self.failed:
                states[name] = {"state": "failed", "reason": self.failed[name].reason}
            elif name in self.unserved:
                states[name] = {"state": "unserved", "reason": self.unserved[name]}
            elif engine is not None and name in engine.status:
                states[name] = {"state": engine.status[name].state}
            else:
                states[name] = {"state": "waiting" if self.loading else "unserved"}
        return states

    def placed_on(self, name: str) -> str:
        """The devices ``name`` is resident on now (comma-separated), or ``-``."""
        engine = self.engine
        if engine is None:
            return "-"
        served = self.stages.get(name)
        key = f"{served.engine_name if served is not None else name}/full"
        where = [d for d, keys in engine.resident().items() if key in keys]
        return ",".join(where) or "-"

    def stage_of_kind(self, kind: str, among: Sequence[str] | None = None) -> ServedStage:
        """The served stage of a kind (the first in policy order, or the first of ``among``)."""
        for name in among if among is not None else self.stages:
            stage = self.stages.get(name)
            if stage is not None and stage.kind == kind:
                return stage
        for name, failure in self.failed.items():
            if failure.kind == kind and (among is None or name in among):
                message = f"stage {name!r} is unavailable: {failure.reason}"
                raise APIError(503, message, code="stage_unavailable")
        if self.loading:
            raise APIError(503, "models are still loading", code="not_ready", retry_after_s=5)
        raise APIError(404, f"this policy serves no {kind} stage", code="stage_not_served")

    def model_id(self, stage: ServedStage) -> str:
        """The public model id of a stage (its model_version without the ``@revision``)."""
        return stage.config.model_version.split("@", 1)[0]

    # --- requests ------------------------------------------------------------------------

    def ready_engine(self) -> Engine:
        """The engine, once it serves (503 with Retry-After while models load)."""
        engine = self.engine
        if engine is None or not self.ready:
            raise APIError(503, "models are still loading", code="not_ready", retry_after_s=5)
        return engine

    # requests: one graph each, through :attr:`calls`
    # (:class:`~hetero.framework.server.graph_calls.GraphCalls`)

    # --- reporting -----------------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        """Per served stage: kind, model, where it is resident, placements by device, warm-up
        timings by device, queue, light runs and run time per item (for /v1/devices, the
        demo)."""
        engine = self.engine
        out = []
        for stage in self.stages.values():
            status = engine.status[stage.engine_name] if engine is not None else StageStatus()
            placements = _placements(self.metrics, stage.engine_name)
            out.append(
                {
                    "stage": stage.name,
                    "kind": stage.kind,
                    "model": self.model_id(stage),
                    "model_version": stage.config.model_version,
                    "resident_on": self.placed_on(stage.name),
                    "placements": placements,
                    "warmup_timings_s": dict(status.timings),
                    "idle_devices": dict(status.idle),
                    "pinned": self.server.runtimes.get(stage.name),
                    "partition": stage.config.partition,
                    "queue_depth": engine.scheduler.queued(stage.engine_name) if engine else 0,
                    "light_runs": status.light_runs,
                    "batches": status.batches,
                    "item_p50_s": _quantile(status.recent_s, 0.5),
                    "item_p99_s": _quantile(status.recent_s, 0.99),
                }
            )
        return out


def _placements(metrics: Metrics, stage: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for family in metrics.registry.collect():
        if family.name != "hetero_placements":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("stage") == stage:
                out[sample.labels["device"]] = int(sample.value)
    return out


def _quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
