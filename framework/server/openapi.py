"""The OpenAPI document: request bodies described (routes read their bodies themselves, so
FastAPI cannot see them) and no 422 (the API answers bad input with 400)."""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from hetero.framework.policy.schema import ServerLimits

__all__ = ["describe_openapi", "json_body", "multipart_body"]


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$defs`` references replaced by the definitions (no cycles here)."""
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(copy.deepcopy(definitions[ref.removeprefix("#/$defs/")]))
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


def json_body(*models: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route whose JSON body is ``models[0]`` (extra models: other
    accepted content types may be added by :func:`multipart_body`)."""
    schema = _inline(models[0].model_json_schema())
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def multipart_body(
    files: tuple[str, ...],
    fields: tuple[str, ...] = (),
    *,
    required: tuple[str, ...] = (),
    also: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``openapi_extra`` for a multipart upload of ``files`` (required) and text ``fields``
    (``required`` ones too); ``also``: a :func:`json_body` the route accepts too."""
    properties: dict[str, Any] = {name: {"type": "string", "format": "binary"} for name in files}
    properties.update({name: {"type": "string"} for name in fields})
    content: dict[str, Any] = {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": properties,
                "required": [*files, *required],
            }
        }
    }
    if also is not None:
        content.update(also["requestBody"]["content"])
    return {"requestBody": {"required": True, "content": content}}


def describe_openapi(app: FastAPI, limits: ServerLimits) -> None:
    """Generate ``app``'s document once: without FastAPI's 422 responses and their schemas, with
    the error body every 4xx/5xx carries, and with this server's limits on token counts and
    batch sizes as maxima."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = original()
        for operations in document.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.get("responses", {})
                responses.pop("422", None)
                for status, meaning in _ERRORS.items():
                    responses.setdefault(
                        status,
                        {
                            "description": meaning,
                            "content": {"application/json": {"schema": _ERROR}},
                        },
                    )
                body = operation.get("requestBody", {}).get("content", {})
                for content in body.values():
                    _apply_limits(content.get("schema", {}), limits)
        schemas = document.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        if "components" in document and not schemas:
            document["components"].pop("schemas", None)
            if not document["components"]:
                document.pop("components")
        app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]


_ERRORS = {
    "4XX": "Refused: bad input (the message names the field), unknown model or route, missing"
    " key or role, body too large, wrong content type",
    "429": "Over the caller's share or the class's queue bound (see Retry-After)",
    "503": "Overloaded or not ready yet (see Retry-After)",
}

_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")


def _apply_limits(schema: dict[str, Any], limits: ServerLimits) -> None:
    """Write the limits the server enforces into a body's schema (in place)."""
    properties = schema.get("properties", {})
    for name in _TOKEN_FIELDS:
        for branch in _branches(properties.get(name)):
            if branch.get("type") == "integer":
                branch["maximum"] = limits.max_output_tokens
    for branch in _branches(properties.get("input")) + _branches(properties.get("texts")):
        if branch.get("type") == "array":
            branch["maxItems"] = limits.max_batch_inputs
    for value in properties.values():
        for branch in _branches(value):
            if branch.get("type") == "object":
                _apply_limits(branch, limits)


def _branches(node: Any) -> list[dict[str, Any]]:
    if not isinstance(node, dict):
        return []
    return [node, *(b for b in node.get("anyOf", ()) if isinstance(b, dict))]


_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
                "request_id": {"type": "string", "description": "as in X-Request-Id"},
                "trace_id": {"type": "string", "description": "W3C trace id, when traced"},
            },
        }
    },
}
