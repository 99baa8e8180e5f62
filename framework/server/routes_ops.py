"""Operations: liveness, readiness, Prometheus metrics, devices and stage placement."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hetero.framework.server.context import CallerDep, runtime_of
from hetero.framework.server.ops_metrics import cluster_unreachable

__all__ = ["router"]

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/ready", response_model=None)
async def ready(request: Request) -> dict[str, Any] | JSONResponse:
    """Readiness, per stage: 200 once every stage that could load is loaded (stages that
    failed say why), 503 while models load, when no stage serves, or when the cluster the
    devices are on lost its head (the Ray mode)."""
    rt = runtime_of(request)
    lost = cluster_unreachable(rt.engine) if rt.ready else None
    ready = rt.ready and lost is None
    body: dict[str, Any] = {
        "ready": ready,
        "status": "ready" if ready else "loading" if rt.loading else "unavailable",
        "stages": rt.stage_states(),
        "load_s": round(rt.load_s, 3),
    }
    if lost is not None:
        body["cluster"] = lost
    if ready:
        return body
    headers = {"Retry-After": "5"} if rt.loading else {}
    return JSONResponse(body, status_code=503, headers=headers)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    return Response(
        generate_latest(runtime_of(request).metrics.registry), media_type=CONTENT_TYPE_LATEST
    )


@router.get("/v1/devices")
async def devices(request: Request, caller: CallerDep) -> dict[str, Any]:
    """The devices found here and, per stage, the runtime it runs on and why."""
    rt = runtime_of(request)
    found: list[dict[str, Any]] = request.app.state.devices
    return {
        "devices": found,
        "stages": rt.describe(),
        "unserved": rt.unserved,
        "policy": rt.spec.name,
    }
