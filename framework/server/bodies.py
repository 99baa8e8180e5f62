"""Request bodies: JSON read under the size limit and validated into pydantic models, with
every failure a 4xx whose message names the field."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile

from hetero.framework.server.errors import APIError

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "Count",
    "EmbeddingRequest",
    "PipelineRequest",
    "SpeechRequest",
    "Text",
    "form_file",
    "read_form",
    "read_json",
]

Model = TypeVar("Model", bound=BaseModel)


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):  # JSON true is not the number 1
        raise ValueError("Input should be a valid integer, not a boolean")
    return value


Count = Annotated[int, BeforeValidator(_not_a_bool)]
"""An integer field: whole floats such as 2.0 are taken (JSON Schema's integer), booleans are
not (pydantic would read ``true`` as 1)."""
Text = Annotated[str, Field(min_length=1)]
"""A text to embed: empty ones have no tokens and are refused."""
StopText = Annotated[str, Field(min_length=1, max_length=256)]
"""A stop sequence: generation ends where it first appears."""


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
    max_tokens: Count | None = Field(default=None, ge=1)
    max_completion_tokens: Count | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    seed: Count | None = Field(default=None, ge=0, le=2**63 - 1)
    n: Count = Field(default=1, ge=1, le=1)
    stop: StopText | Annotated[list[StopText], Field(min_length=1, max_length=4)] | None = None
    user: str | None = None  # the end user; names the data subject (server.subject_header)

    def stop_sequences(self) -> tuple[str, ...]:
        """``stop`` as a tuple (OpenAI takes one string or up to four)."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class EmbeddingRequest(_Body):
    model: str
    input: Text | list[Text] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None  # the end user; names the data subject (server.subject_header)


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
    max_tokens: Count | None = Field(default=None, ge=1)
    user: str | None = None  # the end user; names the data subject (server.subject_header)


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
    where = _lone_surrogate(data, ())
    if where is not None:
        param = ".".join(where) or None
        raise APIError(
            400,
            f"{param or 'body'}: a string holds a lone UTF-16 surrogate (an escape such as"
            " \\ud800 without its pair), which is not a Unicode character",
            param=param,
            code="invalid_value",
        )
    return validate(data, model)


def _lone_surrogate(data: Any, path: tuple[str, ...]) -> tuple[str, ...] | None:
    """The path of the first string (key or value) in ``data`` that holds a lone surrogate:
    valid JSON (``"\\ud800"``) but no text any tokenizer, codec or log can take. Iterative:
    JSON nested as deep as the parser allows must not overflow the stack here."""
    pending: list[tuple[Any, tuple[str, ...]]] = [(data, path)]
    while pending:
        value, where = pending.pop()
        if isinstance(value, str):
            if not value.isascii() and not _encodable(value):
                return where
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _encodable(key):
                    return where
                pending.append((item, (*where, str(key))))
        elif isinstance(value, list):
            pending.extend((item, (*where, str(i))) for i, item in enumerate(value))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
