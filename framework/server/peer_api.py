"""The peers harness's API (``../shared/peers``): ``POST /embed {"texts": [...]}`` and
``POST /vision {"image_b64": ...}``, answered through the same engine as every other route.
Mounted only when the policy sets ``server.peer_routes: true`` (``policies/bench-serve.yaml``,
which ``hetero bench serve`` serves); the bench measures them, the server answers them."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from hetero.framework.scheduler.breakers import RequestProfile
from hetero.framework.server.bodies import Text, read_json
from hetero.framework.server.context import CallerDep, runtime_of
from hetero.framework.server.errors import APIError
from hetero.framework.server.fastjson import FastJSONResponse
from hetero.framework.server.media import decode_base64, image_size
from hetero.framework.server.openapi import json_body

__all__ = ["router"]

router = APIRouter()


class _PeerEmbed(BaseModel):
    model_config = ConfigDict(extra="ignore")
    texts: list[Text] = Field(min_length=1)


class _PeerVision(BaseModel):
    model_config = ConfigDict(extra="ignore")
    image_b64: str = Field(min_length=1)


@router.post("/embed", openapi_extra=json_body(_PeerEmbed))
async def peer_embed(request: Request, caller: CallerDep) -> FastJSONResponse:
    """The peers harness's ``{"texts": [...]}`` -> ``{"embeddings": [[384 floats]...]}``."""
    rt = runtime_of(request)
    body = await read_json(request, _PeerEmbed)
    if len(body.texts) > rt.limits.max_batch_inputs:
        raise APIError(400, f"texts: over the limit of {rt.limits.max_batch_inputs}", param="texts")
    vectors, _ = await rt.calls.embed(body.texts, caller=caller)
    return FastJSONResponse({"embeddings": vectors})


@router.post("/vision", openapi_extra=json_body(_PeerVision))
async def peer_vision(request: Request, caller: CallerDep) -> FastJSONResponse:
    """The peers harness's ``{"image_b64"}`` -> ``{"embedding": [1280 floats], "top1": int}``."""
    rt = runtime_of(request)
    body = await read_json(request, _PeerVision)
    image = decode_base64(body.image_b64, "image_b64")
    width, height = image_size(image, rt.limits, "image_b64")
    stage = rt.stage_of_kind("vision_encode")
    value, _ = await rt.calls.run(
        stage,
        image,
        caller=caller,
        content=image,
        profile=RequestProfile.of_image(width, height),
    )
    embedding = value["embedding"]
    return FastJSONResponse({"embedding": embedding, "top1": int(value["top1"])})
