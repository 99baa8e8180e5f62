"""The policy's own routes (``routes:`` in the YAML, e.g. ``/v1/id-cards/read``): each reaches its
pipeline or stage with the same JSON body as ``POST /v1/pipelines/{name}``. Included after
every built-in router, so a built-in path always wins."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from hetero.framework.server.context import CallerDep, runtime_of
from hetero.framework.server.errors import APIError
from hetero.framework.server.routes_modal import pipeline

__all__ = ["router"]

router = APIRouter()


@router.post("/{path:path}")
async def policy_route(path: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """A route the policy declares; 404 in OpenAI's error shape for any other path."""
    rt = runtime_of(request)
    route = "/" + path
    target = rt.spec.routes.get(route)
    if target is None:
        raise APIError(404, f"unknown route POST {route}", code="unknown_route")
    return await pipeline(str(target), request, caller)
