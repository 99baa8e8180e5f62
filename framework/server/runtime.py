"""The serving runtime: one loaded model per policy stage, each behind its own queue and worker
threads, with the feature cache, the complexity breaker and the compliance gate in front.

Start-up (:meth:`ServingRuntime.start`) prepares and loads every model; where a stage can run
on several runtimes and the policy pins none, each is loaded and timed on a few calls and the
fastest is kept (the choice is recorded in :attr:`StageRuntime.timings`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hetero.cache.feature_cache import FeatureCache
from hetero.cache.keys import feature_key
from hetero.framework.errors import HeteroError, ShedError
from hetero.framework.policy import Policy
from hetero.framework.policy.schema import StageConfig
from hetero.framework.registry import Registry, default_registry
from hetero.framework.scheduler.breakers import Admission, ComplexityBreaker, RequestProfile
from hetero.framework.server.auth import Caller
from hetero.framework.server.calls import Generation, batch_call, probe_payload
from hetero.framework.server.errors import APIError
from hetero.framework.server.gate import ComplianceGate, SandboxProvider
from hetero.framework.server.metrics import ServerMetrics
from hetero.framework.server.stages import BATCHABLE, discover_stage_models, stage_kind
from hetero.framework.server.workers import StageWorkers

__all__ = [
    "ServingRuntime",
    "StageFailure",
    "StageRun",
    "StageRuntime",
    "StagesFailedError",
    "describe_failure",
]

logger = logging.getLogger(__name__)

CACHED_KINDS = frozenset({"vision_encode", "ocr", "asr", "text_embed"})
PROBE_CALLS = 2
Progress = Callable[[str, str], None]


@dataclass
class StageRuntime:
    """One served stage."""

    name: str
    kind: str
    config: StageConfig
    model_class: Any
    model: Any = None
    runtime: str = ""
    timings: dict[str, float | str] = field(default_factory=dict)
    workers: StageWorkers | None = None
    breaker: ComplexityBreaker | None = None
    call_s: float = 0.0
    light_runs: int = 0
    degrade_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def sensitive(self) -> bool:
        """Whether the stage touches a data partition."""
        return self.config.partition is not None


@dataclass(frozen=True, slots=True)
class StageFailure:
    """Why a stage's model could not load."""

    kind: str
    reason: str


class StagesFailedError(HeteroError):
    """Start-up asked for every stage and some could not load."""

    def __init__(self, failed: Mapping[str, StageFailure]) -> None:
        self.failed = dict(failed)
        names = ", ".join(sorted(failed))
        super().__init__(f"stages that could not load: {names}")


def describe_failure(err: BaseException) -> str:
    """One line: what went wrong loading a model (the fix is in the message where known)."""
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else ""
    if isinstance(err, HeteroError):
        return text or type(err).__name__
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


@dataclass(frozen=True, slots=True)
class StageRun:
    """How a stage answered one request (reported to the client)."""

    stage: str
    runtime: str
    variant: str
    cached: bool = False
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        out: dict[str, Any] = {
            "stage": self.stage,
            "runtime": self.runtime,
            "variant": self.variant,
            "cached": self.cached,
        }
        if self.reason:
            out["degraded_because"] = self.reason
        return out


class ServingRuntime:
    """Models, queues, cache and gate for one policy.

    Args:
        policy: The policy served.
        stage_models: {kind: ModelStage class}; by default the ``stage_model`` plugins.
        registry: Where plugins are found (the process-wide registry by default).
        gate: The compliance gate for stages with a partition.
        sandboxes: Runs stages with a partition inside the partition's sandbox. Without it
            those stages are not served: sensitive media never reach an unsandboxed model.
        model_cache_dir: Where models keep derived artefacts.
        cache_directory: The feature cache's disk tier directory (the policy's by default).
        use_cache: Whether stage outputs are cached at all.
        probe_runtimes: Whether to time every runtime a stage supports at start-up.
        metrics: Where to count (a fresh registry by default).
        require_all_stages: Fail start-up when any stage's model cannot load, instead of
            serving the others.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        stage_models: Mapping[str, Any] | None = None,
        registry: Registry | None = None,
        gate: ComplianceGate | None = None,
        sandboxes: SandboxProvider | None = None,
        model_cache_dir: Path | None = None,
        cache_directory: Path | None = None,
        use_cache: bool = True,
        probe_runtimes: bool = True,
        metrics: ServerMetrics | None = None,
        require_all_stages: bool = False,
    ) -> None:
        self.policy = policy
        self.spec = policy.spec
        self.server = policy.spec.server
        self.limits = self.server.limits
        self.gate = gate
        self.sandboxes = sandboxes
        self.metrics = metrics or ServerMetrics()
        self._model_cache_dir = model_cache_dir
        self._probe = probe_runtimes
        self._registry = registry
        self._stage_models = dict(stage_models) if stage_models is not None else None
        self._cache_directory = Path(cache_directory) if cache_directory is not None else None
        self._use_cache = use_cache
        self.cache: FeatureCache | None = None
        self.stages: dict[str, StageRuntime] = {}
        self.unserved: dict[str, str] = {}
        self.failed: dict[str, StageFailure] = {}
        self.require_all_stages = require_all_stages
        self._ready = threading.Event()
        self._loaded = threading.Event()
        self._closing = threading.Event()
        self._release_lock = threading.Lock()
        self._released: set[str] = set()
        self.started_at = time.time()
        self.load_s = 0.0

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
        """(stage, kind) of every stage that has a model, in policy order."""
        classes = self._classes()
        out = []
        for name, config in self.spec.stages.items():
            kind = stage_kind(name, config)
            if kind is None or kind not in classes:
                self._unserve(name, "no model" if kind is None else f"no {kind} model plugin")
                continue
            out.append((name, kind))
        return out

    def _classes(self) -> dict[str, Any]:
        if self._stage_models is None:
            self._stage_models = discover_stage_models(self._registry or default_registry())
        return self._stage_models

    def start(self, progress: Progress | None = None) -> None:
        """Load every model, pick runtimes, start the workers; then the runtime is ready.

        A stage whose model cannot load is logged (one line: the stage, the cause, the fix
        where one is known), kept in :attr:`failed` and not served; the others are. With
        ``require_all_stages`` the first such failure ends start-up with
        :class:`StagesFailedError` instead, after releasing what loaded.
        """
        began = time.monotonic()
        report = progress or (lambda stage, message: None)
        if self._use_cache and self.spec.cache.enabled:
            self.cache = FeatureCache(self.spec.cache, directory=self._cache_directory)
        classes = self._classes()
        for name, kind in self.plan():
            model_class = self._model_class(name, kind, classes[kind])
            if model_class is None:
                continue
            stage = StageRuntime(name, kind, self.spec.stages[name], model_class)
            report(name, "loading")
            try:
                self._load(stage, report)
            except Exception as err:
                reason = describe_failure(err)
                self.failed = {**self.failed, name: StageFailure(kind, reason)}
                logger.error("stage %s failed to load: %s", name, reason)
                report(name, f"failed: {reason}")
                if self.require_all_stages:
                    self._release_stages()
                    self.stages = {}
                    raise StagesFailedError(self.failed) from err
                continue
            self._start_workers(stage)
            self.stages = {**self.stages, name: stage}  # swapped whole: handlers iterate it
            report(name, f"ready on {stage.runtime}")
            if self._closing.is_set():  # closed while loading: release what loaded since
                self._release_stages()
                return
        self.load_s = time.monotonic() - began
        self._loaded.set()
        if self.stages:
            self.metrics.ready.set(1)
            self._ready.set()
        logger.info(
            "serving %d stages in %.1f s: %s",
            len(self.stages),
            self.load_s,
            ", ".join(f"{s.name}={s.runtime}" for s in self.stages.values()),
        )

    def stage_states(self) -> dict[str, dict[str, str]]:
        """Per policy stage: ``state`` (waiting, loading, ready, failed, unserved) and, unless
        ready, the ``reason``."""
        states: dict[str, dict[str, str]] = {}
        for name in self.spec.stages:
            if name in self.stages:
                states[name] = {"state": "ready", "runtime": self.stages[name].runtime}
            elif name in self.failed:
                states[name] = {"state": "failed", "reason": self.failed[name].reason}
            elif name in self.unserved:
                states[name] = {"state": "unserved", "reason": self.unserved[name]}
            else:
                done = self._loaded.is_set()
                states[name] = {
                    "state": "unserved" if done else "loading",
                    "reason": "no model" if done else "models are still loading",
                }
        return states

    def _model_class(self, name: str, kind: str, model_class: Any) -> Any:
        """The class that runs stage ``name``: the model itself, or for a stage with a
        partition the sandboxed stand-in (None, with the reason in :attr:`unserved`, when it
        cannot be sandboxed: never an unsandboxed fallback)."""
        partition = self.spec.stages[name].partition
        if partition is None:
            return model_class
        if self.sandboxes is None:
            self._unserve(name, f"touches partition {partition!r} and no sandbox is configured")
            return None
        try:
            return self.sandboxes.model_class(name, kind)
        except Exception as err:
            self._unserve(name, f"partition {partition!r} cannot be sandboxed here: {err}")
            logger.warning("stage %s not served: %s", name, self.unserved[name])
            return None

    def _unserve(self, name: str, reason: str) -> None:
        self.unserved = {**self.unserved, name: reason}  # swapped whole: handlers iterate it

    def _new_model(self, stage: StageRuntime, runtime: str) -> Any:
        return stage.model_class(
            runtime=runtime,
            cache_dir=self._model_cache_dir,
            threads=self.server.model_threads.get(stage.name, self.server.threads_per_model),
        )

    def _load(self, stage: StageRuntime, report: Progress) -> None:
        pinned = self.server.runtimes.get(stage.name)
        candidates = [pinned] if pinned else list(stage.model_class.runtimes)
        if not self._probe:
            candidates = candidates[:1]
        best: tuple[float, str, Any] | None = None
        errors: list[Exception] = []
        for runtime in candidates:
            report(stage.name, f"loading on {runtime}")
            model = None
            try:
                model = self._new_model(stage, runtime)
                model.load()
                seconds = self._time(stage.kind, model) if len(candidates) > 1 else 0.0
            except Exception as err:
                if model is not None:
                    model.close()  # loaded but failed its timing: release it
                if len(candidates) == 1:
                    raise
                errors.append(err)
                stage.timings[runtime] = f"unavailable: {type(err).__name__}: {err}"
                logger.warning("stage %s: runtime %s unavailable: %s", stage.name, runtime, err)
                continue
            stage.timings[runtime] = seconds
            if best is None or seconds < best[0]:
                if best is not None:
                    best[2].close()
                best = (seconds, runtime, model)
            else:
                model.close()
        if best is None:
            causes = {describe_failure(err) for err in errors}
            if len(causes) == 1:  # the same cause on every runtime: that is the reason
                raise errors[0]
            tried = "; ".join(f"{r}: {stage.timings[r]}" for r in candidates)
            raise RuntimeError(f"no runtime could load its model ({tried})")
        stage.call_s = best[0]
        stage.runtime, stage.model = best[1], best[2]

    @staticmethod
    def _time(kind: str, model: Any) -> float:
        call = batch_call(kind, model)
        payload = probe_payload(kind)
        call("full", [payload])  # the first call pays for lazy initialisation
        samples = []
        for _ in range(PROBE_CALLS):
            began = time.perf_counter()
            results = call("full", [payload])
            samples.append(time.perf_counter() - began)
            if isinstance(results[0], Exception):
                raise results[0]
        return min(samples)

    def _start_workers(self, stage: StageRuntime) -> None:
        qos = self.spec.qos
        variants = stage.config.variants
        batchable = stage.kind in BATCHABLE
        max_batch: dict[str, int] = {
            str(name): (v.max_batch if batchable and v.batchable else 1)
            for name, v in variants.items()
        }
        delays = [v.max_delay_ms for v in variants.values() if v.max_delay_ms is not None]
        delay_ms = delays[0] if delays else self.spec.scheduler.batching.max_delay_ms
        stage.workers = StageWorkers(
            stage.name,
            batch_call(stage.kind, stage.model),
            weights={name: c.weight for name, c in qos.classes.items()},
            aging_per_second=qos.aging_per_second,
            bound=self.server.queue_bound,
            class_bounds={name: c.queue_bound for name, c in qos.classes.items()},
            threads=self.server.workers.get(stage.name, 1),
            max_batch=max_batch,
            max_delay_s=(delay_ms / 1000.0) if batchable else 0.0,
            metrics=self.metrics,
            runtime_label=stage.runtime,
            nice=self.server.nice.get(stage.name, 0),
        )
        stage.breaker = ComplexityBreaker(self.spec.circuit_breaker.complexity)

    def close(self) -> None:
        """Stop the workers and release the models (a :meth:`start` still loading in another
        thread stops after its current stage and releases it too)."""
        self._closing.set()
        self._ready.clear()
        self.metrics.ready.set(0)
        self._release_stages()

    def _release_stages(self) -> None:
        with self._release_lock:
            for stage in self.stages.values():
                if stage.name in self._released:
                    continue
                self._released.add(stage.name)
                if stage.workers is not None:
                    stage.workers.close()
                    if not stage.workers.stopped:  # a batch still runs: leave its model be
                        logger.warning("stage %s: a model call outlived close()", stage.name)
                        continue
                if stage.model is not None:
                    stage.model.close()

    # --- lookup --------------------------------------------------------------------------

    def stage_of_kind(self, kind: str, among: Sequence[str] | None = None) -> StageRuntime:
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

    def model_id(self, stage: StageRuntime) -> str:
        """The public model id of a stage (its model_version without the ``@revision``)."""
        return stage.config.model_version.split("@", 1)[0]

    # --- admission -----------------------------------------------------------------------

    def _admit(self, stage: StageRuntime, caller: Caller, request_id: str) -> None:
        if not self.ready:
            raise APIError(503, "models are still loading", code="not_ready", retry_after_s=5)
        if not stage.sensitive:
            return
        if caller.anonymous:
            raise APIError(
                401,
                f"stage {stage.name!r} touches partition {stage.config.partition!r}: "
                "an API key is required",
                code="authentication_required",
            )
        if self.gate is not None:
            try:
                self.gate.authorize(caller.principal, stage.name, request_id)
            except Exception as err:
                raise APIError(403, f"stage {stage.name!r}: {err}", code="access_denied") from err

    def _variant(self, stage: StageRuntime, caller: Caller, profile: RequestProfile) -> StageRun:
        assert stage.workers is not None and stage.breaker is not None
        depth = stage.workers.depth
        queue_delay = depth * stage.call_s
        deadline = self.spec.sla_tiers[caller.sla_tier].deadline_ms / 1000.0
        decision = stage.breaker.decide(profile, queue_delay, deadline)
        if decision.action is Admission.SHED:
            self.metrics.shed.labels(stage.name, "complexity").inc()
            raise ShedError(decision.reason, status=429, retry_after_s=decision.retry_after_s)
        reason = ""
        if "light" in stage.config.variants:
            if depth >= self.server.degrade_queue_depth:
                reason = f"queue depth {depth} >= {self.server.degrade_queue_depth}"
            elif decision.action is Admission.DEGRADE:
                reason = decision.reason
        if reason:
            stage.light_runs += 1
            key = "queue" if reason.startswith("queue") else "complexity"
            stage.degrade_reasons[key] = stage.degrade_reasons.get(key, 0) + 1
            self.metrics.degraded.labels(stage.name, key).inc()
            return StageRun(stage.name, stage.runtime, "light", reason=reason)
        return StageRun(stage.name, stage.runtime, "full")

    async def _submit(
        self, stage: StageRuntime, payload: Any, run: StageRun, caller: Caller
    ) -> Any:
        assert stage.workers is not None
        try:
            job = stage.workers.submit(payload, run.variant, caller.qos_class)
        except ShedError as err:
            self.metrics.shed.labels(stage.name, "queue_full").inc()
            err.retry_after_s = max(self.server.retry_after_s, stage.workers.depth * stage.call_s)
            raise
        began = time.monotonic()
        try:
            result = await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.cancelled = True
            raise
        elapsed = time.monotonic() - began
        stage.call_s += 0.1 * (elapsed / max(1, stage.workers.depth or 1) - stage.call_s)
        return result

    def _mask(self, stage: StageRuntime, caller: Caller, value: Any) -> Any:
        if stage.sensitive and self.gate is not None:
            return self.gate.mask(caller.principal, stage.name, value)
        return value

    def _key(self, stage: StageRuntime, variant: str, content: bytes) -> Any:
        return feature_key(
            content,
            stage=stage.name,
            model_version=stage.config.model_version,
            params={"variant": variant},
        )

    def _cacheable(self, stage: StageRuntime) -> bool:
        return self.cache is not None and stage.kind in CACHED_KINDS and not stage.sensitive

    # --- stage calls ---------------------------------------------------------------------

    async def run(
        self,
        stage: StageRuntime,
        payload: Any,
        *,
        caller: Caller,
        request_id: str | None = None,
        profile: RequestProfile | None = None,
        content: bytes | None = None,
    ) -> tuple[Any, StageRun]:
        """One item through one stage (cache, breaker, queue, model, mask)."""
        request_id = request_id or uuid.uuid4().hex
        self._admit(stage, caller, request_id)
        run = self._variant(stage, caller, profile or RequestProfile())
        key = None
        if content is not None and self._cacheable(stage):
            assert self.cache is not None
            key = self._key(stage, run.variant, content)
            hit = self.cache.get(key)
            if hit is not None:
                self.metrics.cache_hits.labels(stage.name).inc()
                return self._mask(stage, caller, _from_cache(stage.kind, hit)), StageRun(
                    run.stage, run.runtime, run.variant, cached=True, reason=run.reason
                )
            self.metrics.cache_misses.labels(stage.name).inc()
        result = await self._submit(stage, payload, run, caller)
        if key is not None and self.cache is not None:
            self.cache.put(key, _to_cache(stage.kind, result))
        return self._mask(stage, caller, result), run

    async def embed(
        self, texts: Sequence[str], *, caller: Caller, request_id: str | None = None
    ) -> tuple[np.ndarray[Any, Any], StageRun]:
        """Embeddings of ``texts`` ``[N, 384]``; cached text by text, misses in one job."""
        stage = self.stage_of_kind("text_embed")
        request_id = request_id or uuid.uuid4().hex
        self._admit(stage, caller, request_id)
        tokens = sum(len(t) for t in texts) // 4
        run = self._variant(stage, caller, RequestProfile(text_tokens=tokens))
        vectors: list[np.ndarray[Any, Any] | None] = [None] * len(texts)
        keys: list[Any] = [None] * len(texts)
        if self._cacheable(stage):
            assert self.cache is not None
            for index, text in enumerate(texts):
                keys[index] = self._key(stage, run.variant, text.encode())
                hit = self.cache.get(keys[index])
                if hit is not None:
                    vectors[index] = np.asarray(hit, dtype=np.float32)
        missing = [i for i, v in enumerate(vectors) if v is None]
        hits = len(texts) - len(missing)
        if hits:
            self.metrics.cache_hits.labels(stage.name).inc(hits)
        if missing:
            if self.cache is not None and self._cacheable(stage):
                self.metrics.cache_misses.labels(stage.name).inc(len(missing))
            computed = await self._submit(stage, [texts[i] for i in missing], run, caller)
            for row, index in enumerate(missing):
                vectors[index] = computed[row]
                if keys[index] is not None and self.cache is not None:
                    self.cache.put(keys[index], np.ascontiguousarray(computed[row]))
        stacked = np.stack([v for v in vectors if v is not None]).astype(np.float32)
        cached = not missing
        return stacked, StageRun(stage.name, stage.runtime, run.variant, cached, run.reason)

    async def generate(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        caller: Caller,
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        request_id: str | None = None,
        prompt_tokens: int = 0,
    ) -> tuple[AsyncIterator[str], asyncio.Future[dict[str, Any]], StageRun]:
        """Start generating; returns (pieces as they come, the final summary, how it runs).

        Closing the iterator early (a client that went away) stops generation in the worker.
        """
        stage = self.stage_of_kind("llm_generate")
        request_id = request_id or uuid.uuid4().hex
        self._admit(stage, caller, request_id)
        run = self._variant(stage, caller, RequestProfile(text_tokens=prompt_tokens + max_tokens))
        if run.variant == "light":
            max_tokens = min(max_tokens, 16)
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str | None] = asyncio.Queue()

        def on_piece(piece: str) -> None:
            try:
                loop.call_soon_threadsafe(pieces.put_nowait, piece)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                job.stop.set()

        job = Generation(list(messages), max_tokens, temperature, seed, on_piece)
        summary: asyncio.Future[dict[str, Any]] = loop.create_future()
        began = time.monotonic()
        task = asyncio.ensure_future(self._submit(stage, job, run, caller))

        def finished(done: asyncio.Future[Any]) -> None:
            pieces.put_nowait(None)
            if summary.done():
                return
            if done.cancelled():
                summary.cancel()
            elif done.exception() is not None:
                summary.set_exception(done.exception())  # type: ignore[arg-type]
            else:
                summary.set_result(done.result())

        task.add_done_callback(finished)
        metrics = self.metrics

        async def stream() -> AsyncIterator[str]:
            first = True
            try:
                while True:
                    piece = await pieces.get()
                    if piece is None:
                        break
                    if first:
                        metrics.ttft.observe(time.monotonic() - began)
                        first = False
                    yield piece
            finally:
                if not task.done():
                    job.stop.set()
                    task.cancel()

        await asyncio.sleep(0)  # let the submission happen now, so a full queue sheds here
        if task.done() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        return stream(), summary, run

    # --- reporting -----------------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        """Per stage: kind, model, runtime and timings, queue, light runs (for /v1/devices)."""
        out = []
        for stage in self.stages.values():
            out.append(
                {
                    "stage": stage.name,
                    "kind": stage.kind,
                    "model": self.model_id(stage),
                    "runtime": stage.runtime,
                    "runtime_timings_s": stage.timings,
                    "pinned": stage.name in self.server.runtimes,
                    "partition": stage.config.partition,
                    "queue_depth": stage.workers.depth if stage.workers is not None else 0,
                    "light_runs": stage.light_runs,
                    "batches": stage.workers.batches if stage.workers is not None else 0,
                    "batch_p50_s": _quantile(stage.workers.recent_s, 0.5)
                    if stage.workers is not None
                    else None,
                    "batch_p99_s": _quantile(stage.workers.recent_s, 0.99)
                    if stage.workers is not None
                    else None,
                }
            )
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
