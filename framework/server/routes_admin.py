"""Administration: ``POST /admin/policy/reload`` (callers whose API key has the ``admin``
role; anonymous callers never, even on a policy without keys)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from fastapi import APIRouter, Request

from hetero.framework.errors import PolicyError
from hetero.framework.server.context import CallerDep
from hetero.framework.server.errors import APIError
from hetero.framework.server.reload import PolicyReloader, ReloadRefusedError

__all__ = ["ADMIN_ROLE", "router"]

ADMIN_ROLE = "admin"

router = APIRouter()


@router.post("/admin/policy/reload")
async def reload_policy(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Reload the policy file the server was started with: 200 with the keys that changed;
    400 naming the line of a broken file, 409 naming keys that need a restart (the old policy
    keeps serving in both)."""
    if caller.anonymous or ADMIN_ROLE not in caller.principal.roles:
        raise APIError(
            403,
            f"reloading the policy needs an API key with the {ADMIN_ROLE!r} role",
            code="admin_required",
        )
    reloader = cast(PolicyReloader, request.app.state.reloader)
    try:
        report = await asyncio.to_thread(reloader.reload)
    except ReloadRefusedError as err:
        raise APIError(409, str(err), code="restart_required") from err
    except PolicyError as err:
        raise APIError(400, str(err), code="policy_invalid") from err
    return report.to_dict()
