"""Running a policy pipeline for one request: its steps level by level (steps of a level in
parallel), each step's input taken from the request or from the steps before it, and the LLM
prompt built from what the other stages found."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hetero.framework.scheduler.breakers import RequestProfile
from hetero.framework.server.auth import Caller
from hetero.framework.server.errors import APIError
from hetero.framework.server.media import audio_seconds, image_size
from hetero.framework.server.serving import Serving, StageRun

__all__ = ["PipelineInputs", "describe_image", "image_context", "run_pipeline"]

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


async def describe_image(
    rt: Serving,
    image: bytes,
    caller: Caller,
    request_id: str,
    *,
    with_ocr: bool,
    param: str = "image",
) -> tuple[str, list[StageRun]]:
    """Vision labels (and OCR text) of one image, as LLM context."""
    width, height = image_size(image, rt.limits, param)
    profile = RequestProfile(image_pixels=width * height)
    vision = rt.stage_of_kind("vision_encode")
    calls = [
        rt.run(vision, image, caller=caller, request_id=request_id, profile=profile, content=image)
    ]
    ocr = next((s for s in rt.stages.values() if s.kind == "ocr" and not s.sensitive), None)
    if with_ocr and ocr is not None:
        calls.append(
            rt.run(ocr, image, caller=caller, request_id=request_id, profile=profile, content=image)
        )
    results = await asyncio.gather(*calls)
    labels = results[0][0]["labels"]
    text = results[1][0]["text"] if len(results) > 1 else None
    return image_context(labels, text), [run for _, run in results]


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


async def _step(
    rt: Serving,
    pipeline: str,
    stage_name: str,
    inputs: PipelineInputs,
    done: Mapping[str, Any],
    caller: Caller,
    request_id: str,
) -> tuple[Any, StageRun]:
    stage = rt.stages.get(stage_name)
    if stage is None:
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
    kind = stage.kind
    if kind in ("vision_encode", "ocr"):
        image = _need(inputs.image, "an image", pipeline)
        width, height = image_size(image, rt.limits, _field(inputs, "image"))
        value, run = await rt.run(
            stage,
            image,
            caller=caller,
            request_id=request_id,
            profile=RequestProfile(image_pixels=width * height),
            content=image,
        )
        if kind == "vision_encode":
            out = {
                "labels": [{"label": n, "score": s} for n, s in value["labels"]],
                "width": value["width"],
                "height": value["height"],
            }
        else:
            out = {"text": value["text"], "lines": value["lines"]}
        return out, run
    if kind == "asr":
        audio = _need(inputs.audio, "audio", pipeline)
        seconds = audio_seconds(audio, rt.limits, _field(inputs, "audio"))
        value, run = await rt.run(
            stage,
            audio,
            caller=caller,
            request_id=request_id,
            profile=RequestProfile(audio_seconds=seconds),
            content=audio,
        )
        return value, run
    upstream_text = next(
        (
            o.get("text")
            for o in reversed(list(done.values()))
            if isinstance(o, dict) and isinstance(o.get("text"), str)
        ),
        None,
    )
    if kind == "text_embed":
        text = _need(inputs.text or upstream_text, "text", pipeline)
        vectors, run = await rt.embed([text], caller=caller, request_id=request_id)
        return {"embedding": vectors[0].tolist()}, run
    if kind == "tts":
        text = _need(upstream_text or inputs.text, "text", pipeline)
        value, run = await rt.run(stage, (text[:4096], 1.0), caller=caller, request_id=request_id)
        return {"audio_wav_base64": base64.b64encode(value).decode()}, run
    context = []
    for output in done.values():
        if isinstance(output, dict) and "labels" in output:
            labels = [(lab["label"], lab["score"]) for lab in output["labels"]]
            context.append(image_context(labels, None))
        elif isinstance(output, dict) and "lines" in output:
            context.append(image_context(None, output["text"]))
        elif isinstance(output, dict) and "duration_s" in output:
            context.append(f'[Transcribed audio: "{output["text"]}"]')
    question = (
        inputs.prompt
        or inputs.text
        or ("Describe the image in one sentence." if inputs.image else "Summarise this.")
    )
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "\n".join([*context, question])},
    ]
    llm_model = stage.plugin
    prompt_tokens = int(await asyncio.to_thread(llm_model.chat_prompt_tokens, messages))
    if prompt_tokens > rt.limits.max_input_tokens:
        raise APIError(
            400,
            f"the prompt has {prompt_tokens} tokens, over the limit of "
            f"{rt.limits.max_input_tokens}",
            code="context_length_exceeded",
        )
    pieces, summary, run = await rt.generate(
        messages,
        caller=caller,
        max_tokens=inputs.max_tokens,
        request_id=request_id,
        prompt_tokens=prompt_tokens,
    )
    text = "".join([piece async for piece in pieces])
    final = await summary
    return {
        "text": text,
        "finish_reason": final["finish_reason"],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": final["completion_tokens"]},
    }, replace(run, device=final["device"])


async def run_pipeline(
    rt: Serving, name: str, inputs: PipelineInputs, caller: Caller, request_id: str
) -> PipelineResult:
    """Run pipeline ``name`` (or a single stage of that name) of the policy."""
    pipeline = rt.policy.pipelines.get(name)
    if pipeline is not None:
        levels = [
            [(step, pipeline.steps[step].stage) for step in level] for level in pipeline.levels
        ]
    elif name in rt.spec.stages:
        levels = [[(name, name)]]
    else:
        known = ", ".join(sorted(rt.policy.pipelines)) or "none"
        raise APIError(
            404,
            f"unknown pipeline {name!r} (pipelines: {known})",
            param="name",
            code="unknown_pipeline",
        )
    result = PipelineResult()
    for level in levels:
        answers = await asyncio.gather(
            *(
                _step(rt, name, stage, inputs, dict(result.outputs), caller, request_id)
                for _, stage in level
            )
        )
        for (step, _), (output, run) in zip(level, answers, strict=True):
            result.outputs[step] = output
            result.runs.append(run)
    return result
