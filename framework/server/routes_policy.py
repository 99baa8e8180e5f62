"""The policy's own routes (``routes:`` in the YAML, e.g. ``/v1/id-cards/read``): each reaches its
pipeline or stage with the same JSON body as ``POST /v1/pipelines/{name}``. Each is registered by
its own path after every built-in router (a built-in path always wins), so any other path is a
404 and the OpenAPI document lists exactly these."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute

from hetero.framework.server.context import CallerDep
from hetero.framework.server.routes_modal import PIPELINE_BODY, pipeline

__all__ = ["add_policy_routes"]


def add_policy_routes(app: FastAPI, routes: Mapping[str, object]) -> None:
    """``POST <path>`` for every policy route whose path no built-in route already serves."""
    taken = set(_paths(app.routes))
    for path, target in sorted(routes.items()):
        if path in taken:
            continue
        app.add_api_route(
            path,
            _endpoint(str(target)),
            methods=["POST"],
            summary=f"The policy's route to {target}",
            openapi_extra=PIPELINE_BODY,
        )


def _paths(routes: Iterable[object]) -> Iterator[str]:
    """Every path served, through included routers (FastAPI wraps those since 0.16x)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route.path
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _paths(included.routes)


def _endpoint(target: str) -> Callable[..., Awaitable[dict[str, Any]]]:
    async def policy_route(request: Request, caller: CallerDep) -> dict[str, Any]:
        return await pipeline(target, request, caller)

    return policy_route
