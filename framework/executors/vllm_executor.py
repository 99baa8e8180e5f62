"""vLLM execution: one ``AsyncLLM`` engine per loaded model, driven from hetero's threads.

vLLM's async engine runs its scheduler and model in an engine-core process and hands outputs
back on an asyncio loop. :class:`VllmEngine` owns that loop on a thread of its own, so the
engine's lane threads can each call :meth:`VllmEngine.generate` at the same time: every call
is one request to vLLM, and vLLM's scheduler batches whatever is in flight step by step
(continuous batching). Each call streams its text back on the calling thread as vLLM makes it.

What the engine may hold is set here, so the scheduler can know it: the KV cache is
``kv_cache_bytes`` (vLLM's ``kv_cache_memory_bytes``), prefix caching is on. vllm is imported
here only, at load, never at discovery.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hetero.framework.faults import raise_classified
from hetero.framework.text_engine import GenerationOutcome, SamplingSpec, TextEngine

__all__ = ["EngineSettings", "StepStats", "VllmEngine", "engine_args"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
STOP_POLL_S = 0.1  # how soon a set stop event aborts a generation whose tokens are slow
START_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """What a vLLM engine is built with.

    Attributes:
        model_dir: Local folder with config.json, weights and tokenizer (no hub access).
        dtype: Weights and activations (``bfloat16`` on CPUs with AVX512-BF16, ``float16``
            on GPUs).
        max_model_len: Longest prompt plus answer, in tokens.
        max_num_seqs: Most sequences vLLM schedules in one step: the device's run slots.
        kv_cache_bytes: Memory vLLM gives its KV cache.
        prefix_caching: Reuse the KV cache of a prompt prefix seen before.
        device_id: The hetero device it runs on (``vllm:cuda:0``), named in its errors.
        graph: The graph it serves, named in its errors.
        tensor_parallel_size: GPUs the model is split over (a device group's members).
    """

    model_dir: Path
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    max_num_seqs: int = 8
    kv_cache_bytes: int = 1 << 30
    prefix_caching: bool = True
    device_id: str = "vllm"
    graph: str = "decoder"
    tensor_parallel_size: int = 1


def engine_args(s: EngineSettings) -> dict[str, Any]:
    """vLLM's ``AsyncEngineArgs`` for ``s``. A model over several GPUs (a device group) runs
    on vLLM's multiprocessing executor, named: inside a Ray placement group (a device group's
    actor) vLLM would otherwise pick its Ray executor and start Ray workers of its own, while
    the placement group's GPUs are hetero's and the workers are to be this process's own."""
    args: dict[str, Any] = {
        "model": str(s.model_dir),
        "tokenizer": str(s.model_dir),
        "dtype": s.dtype,
        "max_model_len": s.max_model_len,
        "max_num_seqs": s.max_num_seqs,
        "kv_cache_memory_bytes": s.kv_cache_bytes,
        "enable_prefix_caching": s.prefix_caching,
        "tensor_parallel_size": s.tensor_parallel_size,
        "enforce_eager": True,
        "disable_log_stats": True,
        "seed": 0,
    }
    if s.tensor_parallel_size > 1:
        args["distributed_executor_backend"] = "mp"
    return args


@dataclass(slots=True)
class StepStats:
    """What vLLM's scheduler did, step by step (from its stat-logger hook): the evidence of
    continuous batching (several sequences decoded in one step)."""

    steps: int = 0
    max_running: int = 0
    max_tokens_in_step: int = 0
    prefix_hits: int = 0
    prefix_queries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, running: int, generated: int, hits: int, queries: int) -> None:
        """Fold in one engine step."""
        with self._lock:
            self.steps += 1
            self.max_running = max(self.max_running, running)
            self.max_tokens_in_step = max(self.max_tokens_in_step, generated)
            self.prefix_hits += hits
            self.prefix_queries += queries


def _stat_logger_factory(stats: StepStats) -> Any:
    """A vLLM stat-logger class that feeds :class:`StepStats` (vLLM builds one per engine)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class HeteroStepLogger(StatLoggerBase):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.stats = stats

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            running = scheduler_stats.num_running_reqs if scheduler_stats is not None else 0
            prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
            generated = iteration_stats.num_generation_tokens if iteration_stats else 0
            self.stats.record(
                running,
                generated,
                int(getattr(prefix, "hits", 0) or 0),
                int(getattr(prefix, "queries", 0) or 0),
            )

        def log_engine_initialized(self) -> None:
            pass

    return HeteroStepLogger


async def _cancel_pending() -> None:
    """Cancel and await every other task on the running loop."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class VllmEngine(TextEngine):
    """A vLLM ``AsyncLLM`` on a private event loop; :meth:`generate` is thread-safe and
    blocks its caller only."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.stats = StepStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="hetero-vllm-loop", daemon=True
        )
        self._thread.start()
        try:
            self._engine: Any = self._call(self._start(), START_TIMEOUT_S)
        except BaseException:
            self._stop_loop()
            raise
        self.kv_cache_blocks = int(self._engine.vllm_config.cache_config.num_gpu_blocks or 0)

    async def _start(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only: never the hub
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**engine_args(self.settings))
        return AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(self.stats)])

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingSpec,
        on_text: Callable[[str], None],
        stop: threading.Event,
    ) -> GenerationOutcome:
        """One request to vLLM; text pieces go to ``on_text`` on this thread as they come.
        What vLLM raises is classified (:func:`~hetero.framework.faults.classify_fault`): an
        engine that died or failed the request is an ``ExecutionError``, a prompt it refuses
        an ``InvalidInputError``."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        params = SamplingParams(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            seed=sampling.seed,
            repetition_penalty=sampling.repetition_penalty,
            stop=list(sampling.stop) or None,
            stop_token_ids=list(sampling.stop_token_ids) or None,
            skip_special_tokens=True,
            output_kind=RequestOutputKind.DELTA,
        )
        request_id = f"hetero-{uuid.uuid4().hex}"
        outputs: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

        async def pump() -> None:
            try:
                prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
                async for output in self._engine.generate(prompt, params, request_id):
                    outputs.put(("output", output))
            except BaseException as err:
                outputs.put(("error", err))
                raise
            outputs.put(("end", None))

        future = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        pieces: list[str] = []
        tokens: list[int] = []
        finish, cached = "abort", 0
        aborted = ended = False
        try:
            while True:
                try:
                    kind, value = outputs.get(timeout=STOP_POLL_S)
                except queue.Empty:
                    kind, value = "wait", None
                if kind == "end":
                    ended = True
                    break
                if kind == "error":
                    ended = True
                    raise_classified(value, self.settings.device_id, self.settings.graph)
                if kind == "output":
                    cached = int(value.num_cached_tokens or 0)
                    for completion in value.outputs:
                        tokens.extend(completion.token_ids)
                        if completion.text and not aborted:
                            pieces.append(completion.text)
                            on_text(completion.text)
                        if completion.finish_reason is not None:
                            finish = str(completion.finish_reason)
                if stop.is_set() and not aborted:
                    aborted = True  # vLLM ends the request with a final output: "end" follows
                    self._abort(request_id)
        finally:
            if not ended and not aborted:  # on_text raised: vLLM must not go on for nobody
                self._abort(request_id)
        future.result()
        if tokens and finish == "stop" and tokens[-1] in sampling.stop_token_ids:
            tokens.pop()  # the end-of-turn token ends the answer, it is not part of it
        return GenerationOutcome(
            text="".join(pieces),
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(tokens),
            finish_reason="abort" if aborted else finish,
            cached_prompt_tokens=cached,
        )

    def _abort(self, request_id: str) -> None:
        try:
            self._call(self._engine.abort(request_id), START_TIMEOUT_S)
        except Exception:
            logger.exception("vllm: aborting %s failed", request_id)

    def close(self) -> None:
        """Shut the engine (and its engine-core process) down, then the loop."""
        engine, self._engine = self._engine, None
        if engine is not None:
            try:
                engine.shutdown()
                self._call(_cancel_pending(), START_TIMEOUT_S)  # its output handler's tasks
            except Exception:
                logger.exception("vllm: shutting the engine down failed")
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        if not self._thread.is_alive():
            self._loop.close()
