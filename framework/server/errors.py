"""Errors as the HTTP API answers them: OpenAI's ``{"error": {message, type, param, code}}``.

Every refusal is an :class:`APIError`; the handlers installed by :func:`install_error_handlers`
turn it, FastAPI's own 404/405, malformed JSON and hetero's errors into that shape, with
``Retry-After`` on 429 and 503. Bad input is never a 500.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from hetero.framework.errors import HeteroError, ShedError
from hetero.framework.tracing import current_trace

__all__ = ["APIError", "error_response", "install_error_handlers", "invalid_input"]

logger = logging.getLogger(__name__)

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before the answer

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}


class APIError(Exception):
    """A request the server refuses, with everything the error body and headers need."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    @property
    def type(self) -> str:
        """OpenAI's error ``type`` for the status."""
        return _TYPES.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error"
        )


def invalid_input(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    """A 400 for a value the request carries."""
    return APIError(400, message, param=param, code=code)


def error_response(error: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON response for ``error`` (``headers``: more, e.g. ``Allow`` on a 405)."""
    headers = dict(headers or {})
    if error.retry_after_s is not None or error.status in (429, 503):
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s or 1.0)))
    return JSONResponse(_body(error), status_code=error.status, headers=headers)


def _body(error: APIError) -> dict[str, Any]:
    """OpenAI's error shape, plus the ids that find the request in logs and traces."""
    trace = current_trace()
    body: dict[str, Any] = {
        "message": error.message,
        "type": error.type,
        "param": error.param,
        "code": error.code,
    }
    if trace.request_id:
        body["request_id"] = trace.request_id
    if trace.trace_id:
        body["trace_id"] = trace.trace_id
    return {"error": body}


def _validation_message(exc: RequestValidationError) -> APIError:
    first: dict[str, Any] = exc.errors()[0] if exc.errors() else {}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return APIError(400, "the request body is not valid JSON", code="invalid_json")
    param = ".".join(loc) or None
    return APIError(
        400, f"{param or 'body'}: {first.get('msg', 'invalid')}", param=param, code="invalid_value"
    )


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error in OpenAI's shape."""

    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
            return error_response(APIError(404, message, code="unknown_route"))
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"{request.method} is not allowed on {request.url.path} (allowed: {allowed})"
            return error_response(
                APIError(405, message, code="method_not_allowed"), {"Allow": allowed}
            )
        return error_response(APIError(exc.status_code, str(exc.detail)))

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(_validation_message(exc))

    async def shed_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ShedError)
        return error_response(
            APIError(exc.status, str(exc), code="overloaded", retry_after_s=exc.retry_after_s)
        )

    async def hetero_error(_: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, ValueError):
            return error_response(APIError(400, str(exc), code="invalid_input"))
        logger.exception("request failed")
        return error_response(APIError(500, f"{type(exc).__name__}: {exc}", code="internal"))

    async def client_left(request: Request, exc: Exception) -> Response:
        # the client went away before its body had arrived: nobody is left to answer, so one
        # line (not a traceback), and 499 in the request metrics (nginx's "client closed")
        logger.info(
            "%s %s: the client left before sending its whole body", request.method, request.url.path
        )
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        logger.error("internal error", exc_info=exc)
        return error_response(
            APIError(500, f"internal error: {type(exc).__name__}", code="internal")
        )

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(ShedError, shed_error)
    app.add_exception_handler(HeteroError, hetero_error)
    app.add_exception_handler(ClientDisconnect, client_left)
    app.add_exception_handler(Exception, internal_error)


def json_error_bytes(error: APIError) -> bytes:
    """The error body as bytes (for a server-sent event)."""
    return json.dumps(_body(error)).encode()
