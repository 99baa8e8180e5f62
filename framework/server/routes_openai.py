"""OpenAI-compatible routes: chat completions (image parts, streaming), embeddings, audio
transcription and speech, and the model list."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from hetero.framework.scheduler.breakers import RequestProfile
from hetero.framework.server.bodies import (
    ChatRequest,
    EmbeddingRequest,
    SpeechRequest,
    form_file,
    read_form,
    read_json,
)
from hetero.framework.server.context import CallerDep, about, runtime_of
from hetero.framework.server.errors import APIError, json_error_bytes
from hetero.framework.server.fastjson import FastJSONResponse
from hetero.framework.server.graph_steps import PromptBuilder, Step
from hetero.framework.server.media import audio_seconds, decode_data_url
from hetero.framework.server.openapi import json_body, multipart_body
from hetero.framework.server.pipelines import SYSTEM_PROMPT, context_of, image_steps
from hetero.framework.server.served import ServedStage, StageRun
from hetero.framework.server.serving import Serving

__all__ = ["router"]

logger = logging.getLogger(__name__)
CHARS_PER_TOKEN_BOUND = 32  # no tokenizer here packs more than 32 characters into a token
router = APIRouter()


def _check_model(rt: Serving, kind: str, model: str, param: str = "model") -> ServedStage:
    stage = rt.stage_of_kind(kind)
    accepted = {rt.model_id(stage), stage.name, stage.config.model_version}
    if model not in accepted:
        served = sorted(rt.model_id(s) for s in rt.stages.values() if s.kind == kind)
        raise APIError(
            404,
            f"model {model!r} does not exist here; for this route use: {', '.join(served)}",
            param=param,
            code="model_not_found",
        )
    return stage


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _stages_header(runs: list[StageRun]) -> dict[str, str]:
    return {"X-Hetero-Stages": json.dumps([run.to_dict() for run in runs], separators=(",", ":"))}


@router.get("/v1/models")
async def list_models(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Every model served, one per stage."""
    rt = runtime_of(request)
    created = int(rt.started_at)
    data = [
        {
            "id": rt.model_id(stage),
            "object": "model",
            "created": created,
            "owned_by": "hetero",
            "stage": stage.name,
            "device": rt.placed_on(stage.name),
        }
        for stage in rt.stages.values()
    ]
    return {"object": "list", "data": data}


def _chat_messages(
    rt: Serving, body: ChatRequest, stage: ServedStage, counted: dict[str, int]
) -> tuple[dict[str, Step], PromptBuilder]:
    """The steps that look at the request's images (vision and OCR of each, read once), and
    how the LLM's messages are built once they are done (each image replaced by what they
    saw), their tokens counted once into ``counted["prompt_tokens"]``."""
    turns: list[tuple[str, list[str | tuple[str]]]] = []  # a part: text, or (image prefix,)
    steps: dict[str, Step] = {}
    images = 0
    for index, message in enumerate(body.messages):
        if message.content is None or isinstance(message.content, str):
            turns.append((message.role, [message.content or ""]))
            continue
        parts: list[str | tuple[str]] = []
        for part_index, part in enumerate(message.content):
            param = f"messages.{index}.content.{part_index}"
            if part.type == "text":
                parts.append(part.text or "")
                continue
            url = (
                part.image_url
                if isinstance(part.image_url, str) or part.image_url is None
                else part.image_url.url
            )
            if not isinstance(url, str):
                raise APIError(
                    400, f"{param}.image_url: missing", param=param, code="invalid_value"
                )
            images += 1
            if images > 4:
                raise APIError(400, "at most 4 images per request", param=param)
            image = decode_data_url(url, f"{param}.image_url.url")
            prefix = f"image{images}_"
            steps.update(
                image_steps(rt, image, prefix, with_ocr=True, param=f"{param}.image_url.url")
            )
            parts.append((prefix,))
        turns.append((message.role, parts))

    def build(done: Mapping[str, Any]) -> tuple[list[dict[str, str]], list[int]]:
        messages = [
            {
                "role": role,
                "content": "\n".join(
                    p if isinstance(p, str) else context_of(done, p[0]) for p in parts
                ),
            }
            for role, parts in turns
        ]
        if not any(m["role"] in ("system", "developer") for m in messages):
            messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
        for entry in messages:
            if entry["role"] == "developer":
                entry["role"] = "system"
            elif entry["role"] == "tool":
                entry["role"] = "user"
        ids = _prompt_ids(stage, rt.limits.max_input_tokens, messages)
        counted["prompt_tokens"] = len(ids)
        return messages, ids

    return steps, build


def _prompt_ids(stage: ServedStage, limit: int, messages: list[dict[str, str]]) -> list[int]:
    """The prompt's token ids, made once (the plugin generates from them); 400 when over
    ``limit``."""
    characters = sum(len(str(m.get("content", ""))) for m in messages)
    if characters > CHARS_PER_TOKEN_BOUND * limit:
        raise APIError(  # certainly over the limit: refuse before tokenizing
            400,
            f"messages: {characters} characters is over the limit of {limit} tokens",
            param="messages",
            code="context_length_exceeded",
        )
    ids = list(stage.plugin.chat_prompt_ids(messages))
    tokens = len(ids)
    if tokens > limit:
        raise APIError(
            400,
            f"messages: the prompt has {tokens} tokens, over the limit of {limit}",
            param="messages",
            code="context_length_exceeded",
        )
    return ids


def _chat_max_tokens(body: ChatRequest, limit: int) -> int:
    """The answer's token budget: what the request asks, else 128 or the limit if lower."""
    max_tokens = body.max_completion_tokens or body.max_tokens or min(128, limit)
    if max_tokens > limit:
        raise APIError(
            400,
            f"max_tokens: {max_tokens} is over the limit of {limit}",
            param="max_tokens",
            code="invalid_value",
        )
    return max_tokens


@router.post("/v1/chat/completions", response_model=None, openapi_extra=json_body(ChatRequest))
async def chat_completions(request: Request, caller: CallerDep) -> JSONResponse | StreamingResponse:
    """Chat; image parts (data: URLs) go through vision_encode and ocr into the prompt."""
    rt = runtime_of(request)
    body = await read_json(request, ChatRequest)
    caller = about(caller, body.user, "user")
    stage = _check_model(rt, "llm_generate", body.model)
    max_tokens = _chat_max_tokens(body, rt.limits.max_output_tokens)
    request_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    counted: dict[str, int] = {}
    images, build = _chat_messages(rt, body, stage, counted)
    source: Any = build  # with images, the prompt is known (and counted) once they are seen
    ids = None
    if not images:
        source, ids = await asyncio.to_thread(build, {})
    pieces, summary, run = await rt.calls.generate(
        source,
        caller=caller,
        max_tokens=max_tokens,
        temperature=body.temperature,
        seed=body.seed,
        request_id=request_id,
        prompt_ids=ids,
        stop=body.stop_sequences(),
        before=images,
    )
    # streamed: the headers go before the steps run, so where each is resident now
    runs = [rt.calls.planned_run(step.stage) for step in images.values()]
    model = rt.model_id(stage)
    created = int(time.time())
    if not body.stream:
        text = "".join([piece async for piece in pieces])
        final = await summary
        runs = list(final["graph"].runs.values())  # where each step really ran
        prompt_tokens = counted["prompt_tokens"]
        rt.metrics.generated_tokens.inc(final["completion_tokens"])
        return JSONResponse(
            {
                "id": request_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": final["finish_reason"],
                        "logprobs": None,
                    }
                ],
                "usage": _usage(prompt_tokens, final["completion_tokens"]),
                "hetero": {"stages": [r.to_dict() for r in runs]},
            },
            headers=_stages_header(runs),
        )
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        payload = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    async def events() -> AsyncIterator[bytes]:
        try:
            yield chunk({"role": "assistant", "content": ""}, None)
            async for piece in pieces:
                yield chunk({"content": piece}, None)
                if await request.is_disconnected():
                    return
            try:
                final = await summary
            except Exception as err:  # the stream has begun: report in-band, then end it
                logger.warning("chat stream %s failed: %s: %s", request_id, type(err).__name__, err)
                failure = err if isinstance(err, APIError) else APIError(500, "generation failed")
                yield b"data: " + json_error_bytes(failure) + b"\n\n"
                yield b"data: [DONE]\n\n"
                return
            rt.metrics.generated_tokens.inc(final["completion_tokens"])
            yield chunk({}, final["finish_reason"])
            if include_usage:
                payload = {
                    "id": request_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": _usage(counted["prompt_tokens"], final["completion_tokens"]),
                }
                yield b"data: " + json.dumps(payload).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            await pieces.aclose()  # type: ignore[attr-defined]

    runs.append(run)  # streamed: the headers go before the run, so where it starts
    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", **_stages_header(runs)},
    )


@router.post("/v1/embeddings", openapi_extra=json_body(EmbeddingRequest))
async def embeddings(request: Request, caller: CallerDep) -> JSONResponse:
    """Embeddings of a string or a list of strings (``encoding_format`` float or base64)."""
    rt = runtime_of(request)
    body = await read_json(request, EmbeddingRequest)
    caller = about(caller, body.user, "user")
    stage = _check_model(rt, "text_embed", body.model)
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not texts:
        raise APIError(400, "input: must not be empty", param="input", code="invalid_value")
    if not all(isinstance(t, str) for t in texts):
        raise APIError(
            400,
            "input: token arrays are not supported; send strings",
            param="input",
            code="invalid_value",
        )
    if len(texts) > rt.limits.max_batch_inputs:
        raise APIError(
            400,
            f"input: {len(texts)} inputs is over the limit of {rt.limits.max_batch_inputs}",
            param="input",
            code="invalid_value",
        )
    strings = [str(t) for t in texts]
    tokens = 0
    for index, text in enumerate(strings):
        if not text.strip():
            raise APIError(
                400, f"input[{index}]: must not be empty", param="input", code="invalid_value"
            )
        if len(text) > CHARS_PER_TOKEN_BOUND * rt.limits.max_input_tokens:
            raise APIError(  # certainly over the limit: refuse before tokenizing
                400,
                f"input[{index}]: {len(text)} characters is over the limit of "
                f"{rt.limits.max_input_tokens} tokens",
                param="input",
                code="context_length_exceeded",
            )
        count = int(await asyncio.to_thread(stage.plugin.count_tokens, text))
        if count > rt.limits.max_input_tokens:
            raise APIError(
                400,
                f"input[{index}]: {count} tokens is over the limit of {rt.limits.max_input_tokens}",
                param="input",
                code="context_length_exceeded",
            )
        tokens += count
    vectors, run = await rt.calls.embed(strings, caller=caller)
    data = []
    for index, vector in enumerate(vectors):
        value: Any = (
            base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode()
            if body.encoding_format == "base64"
            else vector
        )
        data.append({"object": "embedding", "index": index, "embedding": value})
    return FastJSONResponse(
        {
            "object": "list",
            "data": data,
            "model": rt.model_id(stage),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
        headers=_stages_header([run]),
    )


@router.post(
    "/v1/audio/transcriptions",
    response_model=None,
    openapi_extra=multipart_body(("file",), ("model", "response_format"), required=("model",)),
)
async def transcriptions(request: Request, caller: CallerDep) -> JSONResponse | PlainTextResponse:
    """Speech to text from a multipart upload (``file``, ``model``, ``response_format``)."""
    rt = runtime_of(request)
    form = await read_form(request)
    model = form.get("model")
    if not isinstance(model, str):
        raise APIError(400, "model: required form field", param="model", code="missing_field")
    stage = _check_model(rt, "asr", model)
    response_format = form.get("response_format") or "json"
    if response_format not in ("json", "text", "verbose_json"):
        raise APIError(
            400,
            f"response_format: {response_format!r} is not supported (json, text, verbose_json)",
            param="response_format",
            code="invalid_value",
        )
    audio = await form_file(form, "file")
    seconds = audio_seconds(audio, rt.limits, "file")
    value, run = await rt.calls.run(
        stage, audio, caller=caller, profile=RequestProfile.of_audio(seconds), content=audio
    )
    headers = _stages_header([run])
    if response_format == "text":
        return PlainTextResponse(value["text"] + "\n", headers=headers)
    if response_format == "verbose_json":
        return JSONResponse(
            {
                "task": "transcribe",
                "language": "english",
                "duration": value["duration_s"],
                "text": value["text"],
            },
            headers=headers,
        )
    return JSONResponse({"text": value["text"]}, headers=headers)


@router.post("/v1/audio/speech", openapi_extra=json_body(SpeechRequest))
async def speech(request: Request, caller: CallerDep) -> Response:
    """Text to speech, as WAV."""
    rt = runtime_of(request)
    body = await read_json(request, SpeechRequest)
    stage = _check_model(rt, "tts", body.model)
    if body.response_format != "wav":
        raise APIError(
            400,
            f"response_format: {body.response_format!r} is not supported (wav)",
            param="response_format",
            code="invalid_value",
        )
    if not body.input.strip():
        raise APIError(400, "input: must not be blank", param="input", code="invalid_value")
    audio, run = await rt.calls.run(stage, (body.input, body.speed), caller=caller)
    return Response(audio, media_type="audio/wav", headers=_stages_header([run]))
