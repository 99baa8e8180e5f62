"""A text-generation engine as a stage plugin sees it: the native handle of a graph in the
``vllm`` format (:class:`~hetero.framework.graph.GraphFormat`).

A torch decoder is a module the plugin drives token by token; an engine such as vLLM drives its
own loop, with continuous batching across the generations in flight, so the plugin hands it a
whole request (prompt token ids and a :class:`SamplingSpec`) and gets text back as it is made.
Several threads may call :meth:`TextEngine.generate` at once on one engine: that is how a
device lane runs many generations at the same time (``Backend.run_slots``). Only executors
build engines (``hetero.framework.executors.vllm_executor``); plugins see this protocol.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["GenerationOutcome", "SamplingSpec", "TextEngine"]


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """How to sample one generation.

    Attributes:
        max_tokens: Most new tokens.
        temperature: 0 picks the most likely token (greedy); above 0 samples.
        seed: Seed for sampling, for a reproducible reply.
        repetition_penalty: Above 1 discourages tokens already seen.
        stop: Strings that end generation; the text returned stops before them.
        stop_token_ids: Tokens that end generation (end of turn), never returned.
    """

    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must not be negative, got {self.temperature}")


@dataclass(frozen=True, slots=True)
class GenerationOutcome:
    """What one finished generation made.

    Attributes:
        text: The whole text (the pieces ``on_text`` got, joined).
        prompt_tokens: Tokens of the prompt.
        completion_tokens: Tokens generated (the end-of-turn token not counted).
        finish_reason: ``stop`` (end of turn or a stop string), ``length`` (``max_tokens``)
            or ``abort`` (the caller's ``stop`` event was set).
        cached_prompt_tokens: Prompt tokens served from the engine's prefix cache.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    cached_prompt_tokens: int = 0


class TextEngine(abc.ABC):
    """A generation engine loaded on one device; thread-safe, many generations at once.

    A base class, not a structural protocol: a plugin tells an engine from a torch module by
    it, and a transformers model has a ``generate`` method of its own."""

    @abc.abstractmethod
    def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingSpec,
        on_text: Callable[[str], None],
        stop: threading.Event,
    ) -> GenerationOutcome:
        """Generate for one prompt, calling ``on_text`` with each new piece of text (on the
        calling thread) until it finishes or ``stop`` is set; blocks until then.

        Raises:
            BackendError: The engine or its device failed (out of memory, an engine process
                that died): :func:`hetero.framework.faults.classify_fault` names what the
                runtime raised, so the request is retried on another device.
            InvalidInputError: The engine refused the prompt (longer than its context).
        """
