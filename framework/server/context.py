"""Per-request dependencies: the serving facade and the caller, taken from the app's state."""

from __future__ import annotations

import dataclasses
from typing import Annotated, cast

from fastapi import Depends, Request

from hetero.framework.data_subject import subject_problem
from hetero.framework.server.auth import Caller, KeyRing
from hetero.framework.server.errors import APIError
from hetero.framework.server.serving import Serving
from hetero.sandbox.access import Principal

__all__ = ["CallerDep", "about", "caller_of", "runtime_of"]


def runtime_of(request: Request) -> Serving:
    """The app's :class:`Serving` (the engine's stages, as the routes see them)."""
    return cast(Serving, request.app.state.runtime)


async def caller_of(request: Request) -> Caller:
    """Who calls (401 for a missing or wrong key when the policy has keys). ``async`` so that
    FastAPI runs it on the event loop: a plain function would cost a thread-pool hop per
    request (a remembered key is a lookup; only a new or wrong key goes to a thread for
    scrypt)."""
    keyring = cast(KeyRing, request.app.state.keyring)
    host = request.client.host if request.client is not None else ""
    caller = await keyring.caller_async(
        request.headers.get("authorization"), request.headers.get("x-hetero-qos"), host
    )
    if caller.anonymous and host:  # each address its own fair share of the queues
        caller = dataclasses.replace(caller, principal=Principal(f"anonymous@{host}"))
    header = runtime_of(request).server.subject_header
    subject = request.headers.get(header)
    if subject is not None:
        caller = about(caller, subject, header)
    return caller


def about(caller: Caller, subject: str | None, where: str) -> Caller:
    """``caller`` with the data subject its request names (``where``: the header or field that
    named it, for the 400); a subject already named (by the header) is kept."""
    if subject is None or caller.subject is not None:
        return caller
    problem = subject_problem(subject)
    if problem is not None:
        raise APIError(400, f"{where}: the data subject {problem}", param=where)
    return dataclasses.replace(caller, subject=subject)


CallerDep = Annotated[Caller, Depends(caller_of)]
"""A route parameter of this type is the request's caller."""
