"""Administration: ``POST /admin/policy/reload`` and ``GET /admin/rollouts`` (callers whose
API key has the ``admin`` role; anonymous callers never, even on a policy without keys)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from fastapi import APIRouter, Request

from hetero.framework.errors import PolicyError
from hetero.framework.server.context import CallerDep, runtime_of
from hetero.framework.server.errors import APIError
from hetero.framework.server.reload import PolicyReloader, ReloadRefusedError, RolloutFailedError

__all__ = ["ADMIN_ROLE", "router"]

ADMIN_ROLE = "admin"
MAX_WAIT_S = 600.0

router = APIRouter()


def _require_admin(caller: Any, what: str) -> None:
    if caller.anonymous or ADMIN_ROLE not in caller.principal.roles:
        raise APIError(
            403, f"{what} needs an API key with the {ADMIN_ROLE!r} role", code="admin_required"
        )


@router.post("/admin/policy/reload")
async def reload_policy(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Reload the policy file the server was started with: 200 with the keys that changed
    and the model version swaps started; 400 naming the line of a broken file, 409 naming keys
    that need a restart (``restart_required``) or a new model version that failed to load or
    answer its probe (``rollout_failed``); the old policy keeps serving in each."""
    _require_admin(caller, "reloading the policy")
    reloader = cast(PolicyReloader, request.app.state.reloader)
    try:
        report = await asyncio.to_thread(reloader.reload)
    except ReloadRefusedError as err:
        raise APIError(409, str(err), code="restart_required") from err
    except RolloutFailedError as err:
        raise APIError(409, str(err), code="rollout_failed") from err
    except PolicyError as err:
        raise APIError(400, str(err), code="policy_invalid") from err
    return report.to_dict()


@router.get("/admin/rollouts")
async def rollouts(request: Request, caller: CallerDep) -> dict[str, Any]:
    """The latest model version swap of each stage (state ``canary``, ``draining``,
    ``done``, ``rolled_back``...); with ``wait_s``, answered once no swap is in progress or
    after that many seconds (``idle`` says which)."""
    _require_admin(caller, "reading rollouts")
    wait_s = _wait_s(request.query_params.get("wait_s", "0"))
    versions = runtime_of(request).versions
    idle = await asyncio.to_thread(versions.wait_idle, wait_s)
    return {"idle": idle, "rollouts": versions.report()}


def _wait_s(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= MAX_WAIT_S:  # also refuses nan
        raise APIError(
            400,
            f"wait_s: expected seconds from 0 to {MAX_WAIT_S:.0f}, got {text!r}",
            param="wait_s",
            code="invalid_value",
        )
    return value
