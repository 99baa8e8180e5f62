"""Modality routes (image describe, speech transcribe, any pipeline of the policy) and the
peers benchmark harness's ``/embed`` and ``/vision``."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from hetero.framework.server.bodies import (
    Count,
    PipelineRequest,
    form_file,
    read_form,
    read_json,
)
from hetero.framework.server.context import CallerDep, about, runtime_of
from hetero.framework.server.errors import APIError
from hetero.framework.server.media import decode_base64
from hetero.framework.server.openapi import json_body, multipart_body
from hetero.framework.server.pipelines import PipelineInputs, run_pipeline
from hetero.framework.server.serving import Serving

__all__ = ["PIPELINE_BODY", "router"]

router = APIRouter()


class _MediaBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    image: str | None = None
    audio: str | None = None
    prompt: str | None = None
    max_tokens: Count | None = Field(default=None, ge=1)


PIPELINE_BODY = json_body(PipelineRequest)
_IMAGE_BODY = multipart_body(("file",), ("prompt",), also=json_body(_MediaBody))


DEFAULT_MAX_TOKENS = 64


def _max_tokens(rt: Serving, asked: int | None) -> int:
    """What the request asked for, else 64 or the server's limit if that is lower."""
    value = min(DEFAULT_MAX_TOKENS, rt.limits.max_output_tokens) if asked is None else asked
    if value > rt.limits.max_output_tokens:
        raise APIError(
            400,
            f"max_tokens: {value} is over the limit of {rt.limits.max_output_tokens}",
            param="max_tokens",
        )
    return value


async def _media_request(request: Request, field: str) -> PipelineInputs:
    """A multipart upload (``file`` plus optional ``prompt``) or JSON with base64 ``field``."""
    rt = runtime_of(request)
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media == "multipart/form-data":
        form = await read_form(request)
        data = await form_file(form, "file")
        prompt = form.get("prompt")
        inputs = PipelineInputs(
            prompt=prompt if isinstance(prompt, str) else None,
            max_tokens=_max_tokens(rt, None),
            source="file",
        )
    else:
        body = await read_json(request, _MediaBody)
        value = getattr(body, field)
        if not value:
            raise APIError(
                400,
                f"{field}: required (base64 or a data: URL), or upload a multipart 'file'",
                param=field,
                code="missing_input",
            )
        data = decode_base64(value, field)
        inputs = PipelineInputs(
            prompt=body.prompt, max_tokens=_max_tokens(rt, body.max_tokens), source=""
        )
    if field == "image":
        inputs.image = data
    else:
        inputs.audio = data
    return inputs


def _route_target(rt: Serving, path: str, default: str) -> str:
    return str(rt.spec.routes.get(path, default))


@router.post("/v1/image/describe", openapi_extra=_IMAGE_BODY)
async def image_describe(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Labels of an image and a sentence about it (the policy's image_describe pipeline)."""
    rt = runtime_of(request)
    inputs = await _media_request(request, "image")
    name = _route_target(rt, "/v1/image/describe", "image_describe")
    result = await run_pipeline(rt, name, inputs, caller, uuid.uuid4().hex)
    labels: Any = next((o["labels"] for o in result.outputs.values() if "labels" in o), [])
    description = next((o["text"] for o in result.outputs.values() if "finish_reason" in o), None)
    return {
        "labels": labels,
        "description": description,
        "pipeline": name,
        "outputs": result.outputs,
        "hetero": {"stages": [r.to_dict() for r in result.runs]},
    }


@router.post("/v1/speech/transcribe", openapi_extra=_IMAGE_BODY)
async def speech_transcribe(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Text of an audio clip (multipart ``file`` or JSON ``audio`` in base64)."""
    rt = runtime_of(request)
    inputs = await _media_request(request, "audio")
    name = _route_target(rt, "/v1/speech/transcribe", "asr")
    result = await run_pipeline(rt, name, inputs, caller, uuid.uuid4().hex)
    transcript: dict[str, Any] = next((o for o in result.outputs.values() if "duration_s" in o), {})
    return {
        "text": transcript.get("text", ""),
        "duration_s": transcript.get("duration_s"),
        "pipeline": name,
        "outputs": result.outputs,
        "hetero": {"stages": [r.to_dict() for r in result.runs]},
    }


@router.post("/v1/pipelines/{name}", openapi_extra=PIPELINE_BODY)
async def pipeline(name: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Any pipeline of the policy; inputs per modality (text, base64 image, base64 audio)."""
    rt = runtime_of(request)
    if name not in rt.policy.pipelines:
        known = ", ".join(sorted(rt.policy.pipelines)) or "none"
        raise APIError(
            404,
            f"unknown pipeline {name!r} (pipelines: {known})",
            param="name",
            code="unknown_pipeline",
        )
    body = await read_json(request, PipelineRequest)
    caller = about(caller, body.user, "user")
    inputs = PipelineInputs(
        text=body.inputs.text,
        image=decode_base64(body.inputs.image, "inputs.image") if body.inputs.image else None,
        audio=decode_base64(body.inputs.audio, "inputs.audio") if body.inputs.audio else None,
        prompt=body.prompt,
        max_tokens=_max_tokens(rt, body.max_tokens),
    )
    result = await run_pipeline(rt, name, inputs, caller, uuid.uuid4().hex)
    return {
        "pipeline": name,
        "outputs": result.outputs,
        "hetero": {"stages": [r.to_dict() for r in result.runs]},
    }
