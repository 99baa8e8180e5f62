"""What the HTTP routes need from the engine: the policy's stages by kind, each call through
:meth:`Engine.submit_stage`, the feature cache in front, access checks and masking around.

:class:`Serving` builds the stage plugins (a sensitive stage's plugin comes from the sandbox
provider and is placed only on its partition's sandbox), then, in :meth:`start`, builds the
engine and warms every stage up (prepare, set up, calibrate each eligible device, place). It
runs no model and owns no queue or thread of its own: every model call is the engine's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hetero.cache.feature_cache import FeatureCache
from hetero.cache.keys import feature_key
from hetero.framework.engine import (
    AccessGate,
    Engine,
    EngineResult,
    GraphNode,
    Metrics,
    RequestGraph,
    StageStatus,
    StepTrace,
)
from hetero.framework.engine.heap import release_free_memory
from hetero.framework.errors import HeteroError
from hetero.framework.policy import Policy
from hetero.framework.policy.schema import PolicySpec, ServerConfig, ServerLimits, StageConfig
from hetero.framework.registry import Registry, default_registry
from hetero.framework.scheduler.breakers import RequestProfile
from hetero.framework.server.auth import Caller
from hetero.framework.server.errors import APIError
from hetero.framework.server.ops_metrics import CacheTierCollector, SandboxHealthCollector
from hetero.framework.server.reload import pinned_policy
from hetero.framework.server.rollout import ModelVersions, Ticket
from hetero.framework.server.stage_spans import StageSpans
from hetero.framework.stage_plugin import Generation, StagePlugin, stage_kind, stage_plugins

__all__ = [
    "GraphAnswer",
    "PromptBuilder",
    "SandboxProvider",
    "ServedStage",
    "Serving",
    "StageFailure",
    "StageRun",
    "StagesFailedError",
    "Step",
]

logger = logging.getLogger(__name__)

CACHED_KINDS = frozenset({"vision_encode", "ocr", "asr", "text_embed"})
PromptBuilder = Callable[[Mapping[str, Any]], tuple[list[dict[str, str]], Sequence[int] | None]]
"""Builds an LLM step's messages (and their token ids, when counted) from the outputs of the
steps before it."""
LLM_STEP = "llm_generate"  # the generating step of a request graph that ends in generation
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
class ServedStage:
    """A policy stage the server answers with."""

    name: str
    kind: str
    config: StageConfig
    plugin: Any
    engine_stage: str | None = None  # the engine's stage of this version (default: name)

    @property
    def engine_name(self) -> str:
        """The engine stage this version runs as: the policy stage's name for the version
        the server started with, ``<name>@<model_version>`` for one swapped in since."""
        return self.engine_stage or self.name

    @property
    def sensitive(self) -> bool:
        """Whether the stage touches a data partition."""
        return self.config.partition is not None


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


@dataclass(frozen=True, slots=True)
class StageRun:
    """How a stage answered one request (reported to the client)."""

    stage: str
    device: str
    variant: str
    cached: bool = False
    reason: str = ""
    model_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        out: dict[str, Any] = {
            "stage": self.stage,
            "device": self.device,
            "variant": self.variant,
            "cached": self.cached,
        }
        if self.model_version:
            out["model_version"] = self.model_version
        if self.reason:
            out["degraded_because"] = self.reason
        return out


@dataclass(slots=True)
class Step:
    """One step of a request as a route describes it: the stage, its input (or how it is
    built from the outputs of the steps ``after``), the input's profile, measured once where
    the input was read, and the content its feature-cache key is made of (None: not
    cached)."""

    stage: ServedStage
    payload: Any = None
    after: tuple[str, ...] = ()
    compose: Callable[[Mapping[str, Any]], Any] | None = None
    profile: RequestProfile | None = None
    content: bytes | None = None
    items: int | None = None
    answer: bool = True


@dataclass(frozen=True, slots=True)
class GraphAnswer:
    """A finished request graph: the answered steps' outputs and how every step ran."""

    outputs: dict[str, Any]
    runs: dict[str, StageRun]


@dataclass(slots=True)
class Started:
    """A request graph the engine took: its future, when it was submitted and admitted, the
    version each step runs on and each step's span collector."""

    future: Future[EngineResult]
    began: float
    admitted: float
    stages: dict[str, ServedStage]
    spans: dict[str, StageSpans] = field(default_factory=dict)


class _Features:
    """The feature cache as the engine asks it: values converted per stage kind, hits and
    misses counted per policy stage."""

    def __init__(self, serving: Serving, cache: FeatureCache) -> None:
        self.serving = serving
        self.cache = cache

    def _kind(self, stage: str) -> str:
        engine = self.serving.engine
        plugin = engine.plugins.get(stage) if engine is not None else None
        return str(getattr(plugin, "name", ""))

    def lookup(self, stage: str, key: Any) -> tuple[Any, str | None]:
        hit, tier = self.cache.lookup(key)
        name = stage.split("@", 1)[0]  # a swapped-in version's engine stage: name@version
        if hit is None:
            self.serving.metrics.cache_misses.labels(name).inc()
            return None, None
        return _from_cache(self._kind(stage), hit), tier

    def put(self, stage: str, key: Any, value: Any) -> None:
        self.cache.put(key, _to_cache(self._kind(stage), value))


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
        self.load_s = 0.0
        self.versions = ModelVersions(self)

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
            features=_Features(self, self.cache) if self.cache is not None else None,
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

    def _engine(self) -> Engine:
        engine = self.engine
        if engine is None or not self.ready:
            raise APIError(503, "models are still loading", code="not_ready", retry_after_s=5)
        return engine

    def _admit(self, stage: ServedStage, caller: Caller) -> None:
        if stage.sensitive and caller.anonymous:
            raise APIError(
                401,
                f"stage {stage.name!r} touches partition {stage.config.partition!r}: "
                "an API key is required",
                code="authentication_required",
            )

    def _key(self, stage: ServedStage, variant: str, content: bytes) -> Any:
        return feature_key(
            content,
            stage=stage.name,
            model_version=stage.config.model_version,
            params={"variant": variant},
        )

    def _cacheable(self, stage: ServedStage) -> bool:
        return self.cache is not None and stage.kind in CACHED_KINDS and not stage.sensitive

    async def submit(
        self,
        name: str,
        steps: Mapping[str, Step],
        *,
        caller: Caller,
        request_id: str | None = None,
    ) -> GraphAnswer:
        """One request graph through the engine, submitted once: every step's stage on the
        version chosen when the request starts (a request that failed on a canary runs again
        on the version serving the stage), the answer's outputs masked by the engine for the
        caller's role, how each step ran, and its spans in the request's trace."""
        tickets = self._tickets(steps, caller)
        try:
            try:
                return await self._await(self._start(name, steps, tickets, caller, request_id))
            except Exception as err:
                retry = _retried(tickets, err)
                if retry is None:
                    raise
                tickets = retry
                return await self._await(self._start(name, steps, tickets, caller, request_id))
        finally:
            for ticket in tickets.values():
                ticket.close()

    def _tickets(self, steps: Mapping[str, Step], caller: Caller) -> dict[str, Ticket]:
        """The version of each stage the request runs on, one per stage."""
        self._engine()
        tickets: dict[str, Ticket] = {}
        try:
            for step in steps.values():
                if step.stage.name not in tickets:
                    self._admit(step.stage, caller)
                    tickets[step.stage.name] = self.versions.pick(step.stage)
        except BaseException:
            for ticket in tickets.values():
                ticket.close()
            raise
        return tickets

    def _start(
        self,
        name: str,
        steps: Mapping[str, Step],
        tickets: Mapping[str, Ticket],
        caller: Caller,
        request_id: str | None,
    ) -> Started:
        """Build the request graph and submit it (admission included: what it counted is
        what is queued)."""
        engine = self._engine()
        stages = {step: tickets[spec.stage.name].stage for step, spec in steps.items()}
        nodes = {step: self._node(spec, stages[step]) for step, spec in steps.items()}
        graph = RequestGraph(
            name,
            nodes,
            qos_class=caller.qos_class,
            principal=caller.principal,
            request_id=request_id,
        )
        spans = {step: StageSpans(spec.stage.name) for step, spec in steps.items()}
        began = time.monotonic()
        try:
            future = engine.submit_graph(graph)
        except PermissionError as err:
            raise APIError(403, f"{name}: {err}", code="access_denied") from err
        return Started(future, began, time.monotonic(), stages, spans)

    def _node(self, spec: Step, stage: ServedStage) -> GraphNode:
        key = None
        content = spec.content
        if content is not None and self._cacheable(stage):
            key = functools.partial(self._key, stage, content=content)
        return GraphNode(
            stage.engine_name,
            spec.after,
            payload=spec.payload,
            compose=spec.compose,
            profile=spec.profile,
            items=spec.items,
            cache_key=key,
            answer=spec.answer,
        )

    async def _await(self, started: Started) -> GraphAnswer:
        """The engine's answer; cancelling (a client that left) cancels the request."""
        try:
            result = await asyncio.wrap_future(started.future)
        except asyncio.CancelledError:
            started.future.cancel()
            raise
        return self._answer(started, result)

    def _answer(
        self, started: Started, result: EngineResult, streamed: set[str] | None = None
    ) -> GraphAnswer:
        """How each step ran, and its spans (a streamed step's are recorded when its stream
        ends)."""
        runs: dict[str, StageRun] = {}
        for step, stage in started.stages.items():
            variant = result.variants.get(step, "full")
            reason = result.reasons.get(step, "")
            tier = result.cached.get(step)
            run = StageRun(
                stage.name,
                result.devices.get(step, "-"),
                variant,
                tier is not None,
                reason,
                stage.config.model_version,
            )
            runs[step] = run
            spans = started.spans[step]
            spans.admitted(variant, reason, started.admitted)
            if self._cacheable(stage):
                spans.cache_lookup(started.began, tier, started.admitted)
            ran = [trace for trace in result.steps if trace.step == step]
            spans.ran(ran)
            if tier is not None:
                self.metrics.cache_hits.labels(stage.name).inc()
            if streamed is None or step not in streamed:
                spans.done(run, ended=_ended(ran))
        return GraphAnswer(result.outputs, runs)

    async def run(
        self,
        stage: ServedStage,
        payload: Any,
        *,
        caller: Caller,
        request_id: str | None = None,
        profile: RequestProfile | None = None,
        content: bytes | None = None,
    ) -> tuple[Any, StageRun]:
        """One item through one stage: a one-step request graph."""
        spec = Step(stage, payload, profile=profile, content=content)
        answer = await self.submit(
            stage.name, {stage.name: spec}, caller=caller, request_id=request_id
        )
        return answer.outputs[stage.name], answer.runs[stage.name]

    async def embed(
        self, texts: Sequence[str], *, caller: Caller, request_id: str | None = None
    ) -> tuple[np.ndarray[Any, Any], StageRun]:
        """Embeddings of ``texts`` ``[N, 384]``, in parts the plugin cuts to what one model
        call may hold, one after another: a large request holds the model one part at a time
        (others' requests run between its parts) and its memory stays that of one part. Each
        part is a one-step request graph, looked up in the feature cache by the engine (a
        single text keeps the key it has on its own)."""
        stage = self.stage_of_kind("text_embed")
        plugin = stage.plugin
        parts = plugin.split(list(texts), self.engine_max_batch(stage, "full"))
        vectors: list[np.ndarray[Any, Any]] = []
        runs: list[StageRun] = []
        for part in parts:
            step = Step(
                stage, part, profile=plugin.profile(part), content=_content(part), items=len(part)
            )
            answer = await self.submit(
                stage.name, {stage.name: step}, caller=caller, request_id=request_id
            )
            value = np.asarray(answer.outputs[stage.name], dtype=np.float32)
            vectors.append(value.reshape(len(part), -1))
            runs.append(answer.runs[stage.name])
        if len(parts) > 1:  # a large request: give its memory back to the OS
            await asyncio.to_thread(release_free_memory)
        ran = next((r for r in reversed(runs) if not r.cached), runs[-1])
        return np.concatenate(vectors), replace(ran, cached=all(r.cached for r in runs))

    def planned_run(self, stage: ServedStage) -> StageRun:
        """How ``stage`` will run, before it has: where it is resident now."""
        return StageRun(
            stage.name, self.placed_on(stage.name), "full", False, "", stage.config.model_version
        )

    def engine_max_batch(self, stage: ServedStage, variant: str) -> int:
        """The most items one model call of ``stage`` takes."""
        return self._engine().max_batch(stage.engine_name, variant)

    async def generate(
        self,
        messages: Sequence[Mapping[str, str]] | PromptBuilder,
        *,
        caller: Caller,
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        request_id: str | None = None,
        prompt_ids: Sequence[int] | None = None,
        stop: tuple[str, ...] = (),
        before: Mapping[str, Step] | None = None,
    ) -> tuple[AsyncIterator[str], asyncio.Future[dict[str, Any]], StageRun]:
        """Start a request graph that ends in generation: the steps ``before`` (images seen
        by vision and OCR, say) run first, then ``messages`` (or what it builds from their
        outputs) is generated from, streamed as pieces come.

        Returns what to stream and the final summary; closing the stream early (a client that
        went away) stops generation on its device. The summary's ``device`` says where it
        ran. A failed canary generation is counted against the canary, not run again: it
        streamed.
        """
        stage = self.stage_of_kind("llm_generate")
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str | None] = asyncio.Queue()

        def on_piece(piece: str) -> None:
            try:
                loop.call_soon_threadsafe(pieces.put_nowait, piece)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                job.stop.set()

        job = Generation([], max_tokens, temperature, seed, on_piece, stop_sequences=stop)
        steps = _generation_steps(stage, job, messages, before or {}, prompt_ids)
        tickets = self._tickets(steps, caller)
        try:
            started = self._start(stage.name, steps, tickets, caller, request_id)
        except BaseException:
            for ticket in tickets.values():
                ticket.close()
            raise
        summary: asyncio.Future[dict[str, Any]] = loop.create_future()
        began = time.monotonic()
        task = asyncio.ensure_future(asyncio.wrap_future(started.future))
        answered: list[GraphAnswer] = []

        def finished(done: asyncio.Future[EngineResult]) -> None:
            pieces.put_nowait(None)
            error = None if done.cancelled() else done.exception()
            for ticket in tickets.values():
                retry = ticket.failed(error) if error is not None else None
                (retry or ticket).close()
            if summary.done():
                return
            if done.cancelled():
                summary.cancel()
            elif error is not None:
                summary.set_exception(error)
            else:
                result = done.result()
                answer = self._answer(started, result, streamed={LLM_STEP})
                answered.append(answer)
                device = answer.runs[LLM_STEP].device
                summary.set_result({**result.outputs[LLM_STEP], "device": device, "graph": answer})

        task.add_done_callback(finished)
        run = self.planned_run(stage)
        stream = _stream(pieces, task, started, job, self.metrics, began, run, answered)
        return stream, summary, run

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


async def _stream(
    pieces: asyncio.Queue[str | None],
    task: asyncio.Future[Any],
    started: Started,
    job: Generation,
    metrics: Metrics,
    began: float,
    run: StageRun,
    answered: list[GraphAnswer],
) -> AsyncIterator[str]:
    """A generation's pieces as they come; closing it early stops the generation."""
    first_at: float | None = None
    tokens = 0
    try:
        while True:
            piece = await pieces.get()
            if piece is None:
                break
            if first_at is None:
                first_at = time.monotonic()
                metrics.ttft.observe(first_at - began)
            tokens += 1
            yield piece
    finally:
        if not task.done():
            job.stop.set()
            task.cancel()
            started.future.cancel()
        spans = started.spans[LLM_STEP]
        spans.streamed(began, first_at, tokens)
        spans.done(answered[0].runs[LLM_STEP] if answered else run)


def _generation_steps(
    stage: ServedStage,
    job: Generation,
    messages: Sequence[Mapping[str, str]] | PromptBuilder,
    before: Mapping[str, Step],
    prompt_ids: Sequence[int] | None,
) -> dict[str, Step]:
    """The steps of a request that ends in generating ``job``: those ``before`` (not
    answered: their outputs only feed the prompt), then the LLM's."""
    upstream = {name: replace(step, answer=False) for name, step in before.items()}
    if callable(messages):
        build = messages

        def compose(done: Mapping[str, Any]) -> Generation:
            job.messages, ids = build(done)
            job.prompt_ids = tuple(ids) if ids is not None else None
            return job

        llm = Step(stage, after=tuple(upstream), compose=compose)
    else:
        job.messages = list(messages)
        llm = Step(stage, job, after=tuple(upstream))
    if prompt_ids is not None:
        job.prompt_ids = tuple(prompt_ids)
    llm.profile = _profile_of(stage, job)  # the plugin's: the one admission and placement see
    return {**upstream, LLM_STEP: llm}


def _content(texts: Sequence[str]) -> bytes:
    """What a part of texts' cache key is made of: a single text's own bytes, else each
    text length-prefixed (no two different parts give the same bytes)."""
    if len(texts) == 1:
        return texts[0].encode()
    return b"".join(len(t.encode()).to_bytes(8, "little") + t.encode() for t in texts)


def _profile_of(stage: ServedStage, payload: Any) -> RequestProfile | None:
    """The plugin's measure of ``payload`` (None when it cannot tell)."""
    try:
        profile: RequestProfile | None = stage.plugin.profile(payload)
    except Exception:  # a payload it cannot measure is judged by the run itself
        return None
    return profile


def _retried(tickets: Mapping[str, Ticket], error: BaseException) -> dict[str, Ticket] | None:
    """The tickets to answer a request again with, when it failed on a canary."""
    out = dict(tickets)
    again = False
    for name, ticket in tickets.items():
        retry = ticket.failed(error)
        if retry is not None:
            out[name] = retry
            again = True
    return out if again else None


def _ended(ran: Sequence[StepTrace]) -> float | None:
    """When the last of a step's runs ended (None: nothing ran, the cache answered)."""
    ends = [t.started_at + t.load_s + t.run_s for t in ran]
    return max(ends) if ends else None


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


def _to_cache(kind: str, value: Any) -> Any:
    if kind == "vision_encode":
        return {**value, "embedding": np.asarray(value["embedding"]).astype(float).tolist()}
    return value


def _from_cache(kind: str, value: Any) -> Any:
    if kind == "vision_encode" and isinstance(value, dict):
        return {**value, "embedding": np.asarray(value["embedding"], dtype=np.float32)}
    return value
