"""Request bodies: JSON read under the size limit and validated into pydantic models, with
every failure a 4xx whose message names the field."""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile

from hetero.framework.server.errors import APIError

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "EmbeddingRequest",
    "PipelineRequest",
    "SpeechRequest",
    "form_file",
    "read_form",
    "read_json",
]

Model = TypeVar("Model", bound=BaseModel)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ImageURL(_Body):
    url: str
    detail: str | None = None


class ContentPart(_Body):
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageURL | str | None = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class ChatRequest(_Body):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    n: int = Field(default=1, ge=1, le=1)


class EmbeddingRequest(_Body):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


class SpeechRequest(_Body):
    model: str
    input: str = Field(min_length=1, max_length=4096)
    voice: str = "default"
    response_format: str = "wav"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)


class PipelineInputs(_Body):
    text: str | None = None
    image: str | None = None
    audio: str | None = None


class PipelineRequest(_Body):
    inputs: PipelineInputs = PipelineInputs()
    prompt: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


async def read_json(request: Request, model: type[Model]) -> Model:
    """The JSON body validated as ``model``; 415, 400 (malformed JSON, bad field) otherwise."""
    media = _media_type(request)
    if media != "application/json":
        raise APIError(
            415,
            f"expected Content-Type application/json, got {media or 'none'}",
            code="unsupported_media_type",
        )
    raw = await request.body()
    try:
        data: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError, over-long integers
        raise APIError(
            400, f"the request body is not valid JSON: {err}", code="invalid_json"
        ) from None
    except RecursionError:
        raise APIError(
            400, "the request body is not valid JSON: nested too deeply", code="invalid_json"
        ) from None
    return validate(data, model)


def validate(data: Any, model: type[Model]) -> Model:
    """``data`` as ``model``, or a 400 naming the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        where = param or "body"
        raise APIError(400, f"{where}: {first['msg']}", param=param, code="invalid_value") from None


async def read_form(request: Request) -> Any:
    """The multipart form; 415 when the body is not multipart/form-data."""
    media = _media_type(request)
    if media != "multipart/form-data":
        raise APIError(
            415,
            f"expected Content-Type multipart/form-data, got {media or 'none'}",
            code="unsupported_media_type",
        )
    try:
        return await request.form(max_files=4, max_fields=32)
    except APIError:
        raise
    except Exception as err:
        raise APIError(400, f"malformed multipart body: {err}", code="invalid_multipart") from None


async def form_file(form: Any, name: str) -> bytes:
    """Bytes of the uploaded file field ``name``; 400 when it is missing or empty."""
    upload = form.get(name)
    if not isinstance(upload, UploadFile):
        raise APIError(400, f"{name}: a file upload is required", param=name, code="missing_file")
    data = await upload.read()
    if not data:
        raise APIError(400, f"{name}: the uploaded file is empty", param=name, code="empty_file")
    return bytes(data)
