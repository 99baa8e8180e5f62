"""What a route says of a request and what it gets back: its steps (:class:`Step`), the
request graph the engine took (:class:`Started`) and its answer (:class:`GraphAnswer`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from hetero.framework.engine import EngineResult, StepTrace
from hetero.framework.scheduler import RequestProfile
from hetero.framework.server.auth import Caller
from hetero.framework.server.errors import APIError
from hetero.framework.server.served import ServedStage, StageRun
from hetero.framework.server.stage_spans import StageSpans

__all__ = [
    "LLM_STEP",
    "GraphAnswer",
    "PromptBuilder",
    "Started",
    "Step",
    "check_caller",
    "ended_at",
    "profile_of",
    "step_content",
]

PromptBuilder = Callable[[Mapping[str, Any]], tuple[list[dict[str, str]], Sequence[int] | None]]
"""Builds an LLM step's messages (and their token ids, when counted) from the outputs of the
steps before it."""
LLM_STEP = "llm_generate"  # the generating step of a request graph that ends in generation


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
    waits: tuple[str, ...] = ()  # steps it starts after, not taking their outputs


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


def step_content(texts: Sequence[str]) -> bytes:
    """What a part of texts' cache key is made of: each text length-prefixed, a single one
    too (a prefix-free encoding: no text, however crafted, gives another part's bytes)."""
    return b"".join(len(t.encode()).to_bytes(8, "little") + t.encode() for t in texts)


def profile_of(stage: ServedStage, payload: Any) -> RequestProfile | None:
    """The plugin's measure of ``payload`` (None when it cannot tell)."""
    try:
        profile: RequestProfile | None = stage.plugin.profile(payload)
    except Exception:  # a payload it cannot measure is judged by the run itself
        return None
    return profile


def ended_at(ran: Sequence[StepTrace]) -> float | None:
    """When the last of a step's runs ended (None: nothing ran, the cache answered)."""
    ends = [t.started_at + t.load_s + t.run_s for t in ran]
    return max(ends) if ends else None


def check_caller(stage: ServedStage, caller: Caller) -> None:
    """A stage that touches a partition needs an API key (401 for the anonymous)."""
    if stage.sensitive and caller.anonymous:
        raise APIError(
            401,
            f"stage {stage.name!r} touches partition {stage.config.partition!r}: "
            "an API key is required",
            code="authentication_required",
        )
