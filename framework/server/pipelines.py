"""A policy pipeline as one request graph: each step's input taken from the request (read and
measured once) or built from the steps before it, the LLM prompt built from what the other
stages found; the whole graph is submitted to the engine once."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero.framework.scheduler.breakers import RequestProfile
from hetero.framework.server.auth import Caller
from hetero.framework.server.errors import APIError
from hetero.framework.server.graph_steps import LLM_STEP, Step
from hetero.framework.server.media import audio_seconds, image_size
from hetero.framework.server.served import ServedStage, StageRun
from hetero.framework.server.serving import Serving
from hetero.framework.stage_plugin import Generation

__all__ = [
    "LLM_STEP",
    "PipelineInputs",
    "context_of",
    "image_context",
    "image_steps",
    "run_pipeline",
]

SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly and plainly."
LABEL_MIN_P = 0.15  # an ImageNet label below this probability is not given to the LLM


@dataclass
class PipelineInputs:
    """What a request brings, per modality."""

    text: str | None = None
    image: bytes | None = None
    audio: bytes | None = None
    prompt: str | None = None
    max_tokens: int = 64
    source: str = "inputs"  # how errors name the media field: inputs.image, or an upload's "file"


@dataclass
class PipelineResult:
    """Outputs by step, and how each step ran."""

    outputs: dict[str, Any] = field(default_factory=dict)
    runs: list[StageRun] = field(default_factory=list)


def image_context(labels: Sequence[Sequence[Any]] | None, text: str | None) -> str:
    """A sentence for the LLM about what the vision and OCR stages saw."""
    parts = []
    if text and text.strip():
        parts.append(f'Text written in the image: "{text.strip()[:500]}".')
    # Only labels the classifier is fairly sure of: on a page of text its top-5 are noise
    # (1 % "nematode"), which a small LLM would otherwise describe earnestly.
    sure = [str(name).split(",")[0] for name, p in (labels or [])[:3] if float(p) >= LABEL_MIN_P]
    if sure:
        parts.append(f"What the image looks like: {', '.join(sure)}.")
    if not parts:
        return "[An image was attached; nothing could be recognised in it.]"
    return "[Attached image. " + " ".join(parts) + "]"


def image_steps(
    rt: Serving, image: bytes, prefix: str, *, with_ocr: bool, param: str = "image"
) -> dict[str, Step]:
    """The vision (and OCR) steps of one image, its header read once for both; their
    outputs make its LLM context (:func:`context_of`)."""
    width, height = image_size(image, rt.limits, param)
    profile = RequestProfile.of_image(width, height)
    steps = {
        f"{prefix}vision": Step(
            rt.stage_of_kind("vision_encode"), image, profile=profile, content=image
        )
    }
    ocr = next((s for s in rt.stages.values() if s.kind == "ocr" and not s.sensitive), None)
    if with_ocr and ocr is not None:
        steps[f"{prefix}ocr"] = Step(ocr, image, profile=profile, content=image)
    return steps


def context_of(done: Mapping[str, Any], prefix: str) -> str:
    """The LLM context of one image from its steps' outputs (:func:`image_steps`)."""
    vision = done.get(f"{prefix}vision")
    ocr = done.get(f"{prefix}ocr")
    return image_context(
        vision["labels"] if vision is not None else None,
        ocr["text"] if ocr is not None else None,
    )


def _field(inputs: PipelineInputs, modality: str) -> str:
    if inputs.source in ("file", ""):
        return inputs.source or modality
    return f"{inputs.source}.{modality}"


def _need(value: Any, what: str, pipeline: str) -> Any:
    if value is None:
        raise APIError(
            400,
            f"pipeline {pipeline!r} needs {what} (inputs.{what.rsplit(maxsplit=1)[-1]})",
            param=f"inputs.{what.rsplit(maxsplit=1)[-1]}",
            code="missing_input",
        )
    return value


def _served(rt: Serving, pipeline: str, stage_name: str) -> ServedStage:
    stage = rt.stages.get(stage_name)
    if stage is not None:
        return stage
    failure = rt.failed.get(stage_name)
    if failure is not None:
        raise APIError(
            503,
            f"pipeline {pipeline!r}: stage {stage_name!r} is unavailable: {failure.reason}",
            code="stage_unavailable",
        )
    reason = rt.unserved.get(stage_name, "not loaded")
    if rt.loading:
        raise APIError(503, "models are still loading", code="not_ready", retry_after_s=5)
    raise APIError(
        503,
        f"pipeline {pipeline!r}: stage {stage_name!r} has no model here ({reason})",
        code="stage_not_served",
    )


def _upstream_text(done: Mapping[str, Any]) -> str | None:
    return next(
        (
            o.get("text")
            for o in reversed(list(done.values()))
            if isinstance(o, dict) and isinstance(o.get("text"), str)
        ),
        None,
    )


def _messages(
    rt: Serving, stage: ServedStage, inputs: PipelineInputs
) -> Callable[[Mapping[str, Any]], list[dict[str, str]]]:
    """How the LLM step's messages are built from what the steps before it found."""

    def build(done: Mapping[str, Any]) -> list[dict[str, str]]:
        context = []
        for output in done.values():
            if isinstance(output, dict) and "labels" in output:
                context.append(image_context(output["labels"], None))
            elif isinstance(output, dict) and "lines" in output:
                context.append(image_context(None, output["text"]))
            elif isinstance(output, dict) and "duration_s" in output:
                context.append(f'[Transcribed audio: "{output["text"]}"]')
        question = (
            inputs.prompt
            or inputs.text
            or ("Describe the image in one sentence." if inputs.image else "Summarise this.")
        )
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "\n".join([*context, question])},
        ]

    return build


def _step(
    rt: Serving,
    pipeline: str,
    stage: ServedStage,
    after: tuple[str, ...],
    inputs: PipelineInputs,
    counted: dict[str, int],
) -> Step:
    """One step of a pipeline: its input from the request, or built from the steps before."""
    kind = stage.kind
    if kind in ("vision_encode", "ocr"):
        image = _need(inputs.image, "an image", pipeline)
        width, height = image_size(image, rt.limits, _field(inputs, "image"))
        profile = RequestProfile.of_image(width, height)
        return Step(stage, image, after=after, profile=profile, content=image)
    if kind == "asr":
        audio = _need(inputs.audio, "audio", pipeline)
        seconds = audio_seconds(audio, rt.limits, _field(inputs, "audio"))
        profile = RequestProfile.of_audio(seconds)
        return Step(stage, audio, after=after, profile=profile, content=audio)
    if kind == "text_embed":
        if inputs.text is not None or not after:
            text = _need(inputs.text, "text", pipeline)
            return Step(stage, [text], after=after, content=text.encode(), items=1)
        return Step(
            stage,
            after=after,
            compose=lambda done: [_need(_upstream_text(done), "text", pipeline)],
            items=1,
        )
    if kind == "tts":
        if not after:
            text = _need(inputs.text, "text", pipeline)
            return Step(stage, (text[:4096], 1.0))
        return Step(
            stage,
            after=after,
            compose=lambda done: (
                _need(_upstream_text(done) or inputs.text, "text", pipeline)[:4096],
                1.0,
            ),
        )
    build = _messages(rt, stage, inputs)

    def compose(done: Mapping[str, Any]) -> Generation:
        messages = build(done)
        ids = list(stage.plugin.chat_prompt_ids(messages))
        tokens = len(ids)
        if tokens > rt.limits.max_input_tokens:
            raise APIError(
                400,
                f"the prompt has {tokens} tokens, over the limit of {rt.limits.max_input_tokens}",
                code="context_length_exceeded",
            )
        counted["prompt_tokens"] = tokens
        return Generation(messages, inputs.max_tokens, prompt_ids=tuple(ids))

    try:  # the plugin's measure; the prompt is not known until the steps before are done
        planned = stage.plugin.profile(Generation([], inputs.max_tokens))
    except Exception:
        planned = None
    return Step(stage, after=after, compose=compose, profile=planned)


def _shown(kind: str, value: Any, counted: Mapping[str, int]) -> Any:
    """A step's output as the pipeline routes answer with it."""
    if kind == "vision_encode":
        return {
            "labels": [{"label": n, "score": s} for n, s in value["labels"]],
            "width": value["width"],
            "height": value["height"],
        }
    if kind == "ocr":
        return {"text": value["text"], "lines": value["lines"]}
    if kind == "text_embed":
        return {"embedding": [float(x) for x in list(value[0])]}
    if kind == "tts":
        return {"audio_wav_base64": base64.b64encode(value).decode()}
    if kind == "llm_generate":
        return {
            "text": value["text"],
            "finish_reason": value["finish_reason"],
            "usage": {
                "prompt_tokens": counted.get("prompt_tokens", 0),
                "completion_tokens": value["completion_tokens"],
            },
        }
    return value


async def run_pipeline(
    rt: Serving, name: str, inputs: PipelineInputs, caller: Caller, request_id: str
) -> PipelineResult:
    """Run pipeline ``name`` (or a single stage of that name) of the policy as one request
    graph."""
    pipeline = rt.policy.pipelines.get(name)
    if pipeline is not None:
        plan = [
            (step, pipeline.steps[step].stage, pipeline.steps[step].after)
            for step in pipeline.order
        ]
    elif name in rt.spec.stages:
        plan = [(name, name, ())]
    else:
        known = ", ".join(sorted(rt.policy.pipelines)) or "none"
        raise APIError(
            404,
            f"unknown pipeline {name!r} (pipelines: {known})",
            param="name",
            code="unknown_pipeline",
        )
    counted: dict[str, int] = {}
    steps = {
        step: _step(rt, name, _served(rt, name, stage), tuple(after), inputs, counted)
        for step, stage, after in plan
    }
    answer = await rt.calls.submit(name, steps, caller=caller, request_id=request_id)
    result = PipelineResult()
    for step, _, _ in plan:
        result.outputs[step] = _shown(steps[step].stage.kind, answer.outputs[step], counted)
        result.runs.append(answer.runs[step])
    return result
