"""Requests as the engine runs them: a route describes its steps (:class:`Step`), and
:class:`GraphCalls` turns them into one request graph, picks each stage's version (rollout),
submits it once with :meth:`Engine.submit_graph
<hetero.framework.engine.Engine.submit_graph>`, and reports how each step ran and its spans.
The feature cache is asked by the engine through ``cache_adapter.CacheAdapter``; generations stream
their pieces back as they come."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from hetero.cache.keys import feature_key
from hetero.framework.data_subject import SubjectData
from hetero.framework.engine import (
    EngineResult,
    GraphNode,
    Metrics,
    RequestGraph,
)
from hetero.framework.engine.heap import release_free_memory
from hetero.framework.scheduler.breakers import RequestProfile
from hetero.framework.server.auth import Caller
from hetero.framework.server.cache_adapter import CACHED_KINDS
from hetero.framework.server.errors import APIError
from hetero.framework.server.graph_steps import (
    LLM_STEP,
    GraphAnswer,
    PromptBuilder,
    Started,
    Step,
    check_caller,
    ended_at,
    profile_of,
    step_content,
)
from hetero.framework.server.served import ServedStage, StageRun
from hetero.framework.server.stage_spans import StageSpans
from hetero.framework.stage_plugin import Generation

if TYPE_CHECKING:
    from hetero.framework.server.serving import Serving

__all__ = ["GraphCalls"]

PARTS_IN_FLIGHT = 2  # parts of one embeddings request queued or running at once


class GraphCalls:
    """The calls a server makes of its engine: one request graph per request."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving

    def _key(self, stage: ServedStage, variant: str, model_version: str, content: bytes) -> Any:
        return feature_key(
            content, stage=stage.name, model_version=model_version, params={"variant": variant}
        )

    def _cacheable(self, stage: ServedStage) -> bool:
        return self.serving.cache is not None and stage.kind in CACHED_KINDS and not stage.sensitive

    async def submit(
        self,
        name: str,
        steps: Mapping[str, Step],
        *,
        caller: Caller,
        request_id: str | None = None,
    ) -> GraphAnswer:
        """One request graph through the engine, submitted once (the engine picks each
        stage's model version when the request starts, and answers a request that failed
        on a canary again on the version serving the stage), the answer's outputs masked by
        the engine for the caller's role, how each step ran, and its spans in the request's
        trace."""
        return await self._await(self._start(name, steps, caller, request_id))

    def _start(
        self,
        name: str,
        steps: Mapping[str, Step],
        caller: Caller,
        request_id: str | None,
        *,
        falls_back: bool = True,
    ) -> Started:
        """Build the request graph and submit it (admission included: what it counted is
        what is queued)."""
        engine = self.serving.ready_engine()
        for spec in steps.values():
            check_caller(spec.stage, caller)
        stages = {step: spec.stage for step, spec in steps.items()}
        nodes = {step: self._node(spec, spec.stage, caller) for step, spec in steps.items()}
        graph = RequestGraph(
            name,
            nodes,
            qos_class=caller.qos_class,
            principal=caller.principal,
            request_id=request_id,
            falls_back=falls_back,
        )
        spans = {step: StageSpans(spec.stage.name) for step, spec in steps.items()}
        began = time.monotonic()
        try:
            future = engine.submit_graph(graph)
        except PermissionError as err:
            raise APIError(403, f"{name}: {err}", code="access_denied") from err
        return Started(future, began, time.monotonic(), stages, spans)

    def _node(self, spec: Step, stage: ServedStage, caller: Caller) -> GraphNode:
        key = None
        content = spec.content
        if content is not None and self._cacheable(stage):
            key = functools.partial(self._key, stage, content=content)
        payload = spec.payload
        if stage.sensitive and caller.subject is not None and isinstance(payload, bytes):
            payload = SubjectData(payload, caller.subject)  # what the partition keeps is theirs
        return GraphNode(
            stage.name,  # the engine picks the version serving it
            spec.after,
            payload=payload,
            compose=spec.compose,
            profile=spec.profile,
            items=spec.items,
            cache_key=key,
            answer=spec.answer,
            waits=spec.waits,
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
                result.model_versions.get(step, stage.config.model_version),
            )
            runs[step] = run
            spans = started.spans[step]
            spans.admitted(variant, reason, started.admitted)
            if self._cacheable(stage):
                spans.cache_lookup(started.began, tier, started.admitted)
            ran = [trace for trace in result.steps if trace.step == step]
            spans.ran(ran)
            if streamed is None or step not in streamed:
                spans.done(run, ended=ended_at(ran))
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
        """Embeddings of ``texts`` ``[N, 384]``: one request graph whose steps are the parts
        the plugin cuts to what one model call may hold. Admission judges the whole request
        at once; the engine runs no more than :data:`PARTS_IN_FLIGHT` parts at once (each
        part starts after the one that many places before it), so a large request holds the
        model a part at a time (others' requests run between its parts) and its memory
        stays that of a few parts. Each part is looked up in the feature cache by the engine
        under its texts, length-prefixed."""
        stage = self.serving.stage_of_kind("text_embed")
        plugin = stage.plugin
        parts = plugin.split(list(texts), self.engine_max_batch(stage, "full"))
        names = (
            [stage.name] if len(parts) == 1 else [f"{stage.name}#{n}" for n in range(len(parts))]
        )
        steps = {
            name: Step(
                stage,
                part,
                profile=plugin.profile(part),
                content=step_content(part),
                items=len(part),
                waits=(names[n - PARTS_IN_FLIGHT],) if n >= PARTS_IN_FLIGHT else (),
            )
            for n, (name, part) in enumerate(zip(names, parts, strict=True))
        }
        answer = await self.submit(stage.name, steps, caller=caller, request_id=request_id)
        vectors = [
            np.asarray(answer.outputs[name], dtype=np.float32).reshape(len(part), -1)
            for name, part in zip(names, parts, strict=True)
        ]
        if len(parts) > 1:  # a large request: give its memory back to the OS
            await asyncio.to_thread(release_free_memory)
        runs = [answer.runs[name] for name in names]
        ran = next((r for r in reversed(runs) if not r.cached), runs[-1])
        return np.concatenate(vectors), replace(ran, cached=all(r.cached for r in runs))

    def planned_run(self, stage: ServedStage) -> StageRun:
        """How ``stage`` will run, before it has: where it is resident now."""
        return StageRun(
            stage.name,
            self.serving.placed_on(stage.name),
            "full",
            False,
            "",
            stage.config.model_version,
        )

    def engine_max_batch(self, stage: ServedStage, variant: str) -> int:
        """The most items one model call of ``stage`` takes."""
        return self.serving.ready_engine().max_batch(stage.engine_name, variant)

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
        stage = self.serving.stage_of_kind("llm_generate")
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str | None] = asyncio.Queue()

        def on_piece(piece: str) -> None:
            try:
                loop.call_soon_threadsafe(pieces.put_nowait, piece)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                job.stop.set()

        job = Generation([], max_tokens, temperature, seed, on_piece, stop_sequences=stop)
        steps = _generation_steps(stage, job, messages, before or {}, prompt_ids)
        # a generation streams as it goes: one that fails on a canary is counted, not rerun
        started = self._start(stage.name, steps, caller, request_id, falls_back=False)
        summary: asyncio.Future[dict[str, Any]] = loop.create_future()
        began = time.monotonic()
        task = asyncio.ensure_future(asyncio.wrap_future(started.future))
        answered: list[GraphAnswer] = []

        def finished(done: asyncio.Future[EngineResult]) -> None:
            pieces.put_nowait(None)
            error = None if done.cancelled() else done.exception()
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
        stream = _stream(pieces, task, started, job, self.serving.metrics, began, run, answered)
        return stream, summary, run


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
    llm.profile = profile_of(stage, job)  # the plugin's: the one admission and placement see
    return {**upstream, LLM_STEP: llm}
