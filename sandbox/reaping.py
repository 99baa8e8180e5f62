"""Sandboxes a dead server left behind: found in the runtimes' state and removed at start-up.

Since sandboxes hold a lifeline to their server (:mod:`hetero.sandbox.worker`), none should
outlive it; this catches the rest (a server of an older version, a worker wedged before it
took its lifeline) so that an old and a new sandbox never run side by side. Sandbox ids end in
``-<server pid>-<generation>``: those of this process are left alone, every other ``hetero-``
sandbox in the same state directory is removed, and each removal is audited.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from hetero.sandbox.audit import AuditLog
from hetero.sandbox.runtimes.base import SandboxRuntime

__all__ = ["reap_leftovers"]

logger = logging.getLogger(__name__)


def _server_pid(sandbox_id: str) -> int | None:
    parts = sandbox_id.rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return int(parts[1])


def _partition(sandbox_id: str, partitions: Iterable[str]) -> str:
    """The partition a ``hetero-<partition>-<stage>-<pid>-<generation>`` id names (the longest
    known name that fits: names may hold dashes); "" when none does."""
    rest = sandbox_id.removeprefix("hetero-")
    fitting = [name for name in partitions if rest.startswith(name + "-")]
    return max(fitting, key=len, default="")


def reap_leftovers(
    runtimes: Iterable[SandboxRuntime], audit: AuditLog, partitions: Iterable[str] = ()
) -> list[str]:
    """Remove the sandboxes other processes left in ``runtimes``' state; their ids, sorted.

    Each removal writes a ``sandbox_reaped`` record (runtime, sandbox id, the pid of the server
    that started it, the partition among ``partitions`` its id names) and one warning.
    """
    known = tuple(partitions)
    reaped: list[str] = []
    for runtime in runtimes:
        for sandbox_id in runtime.leftovers():
            pid = _server_pid(sandbox_id)
            if pid == os.getpid():
                continue
            runtime.stop(sandbox_id)
            audit.append(
                "sandbox_reaped",
                partition=_partition(sandbox_id, known),
                decision="removed",
                detail={"runtime": runtime.name, "sandbox": sandbox_id, "server_pid": pid},
            )
            logger.warning(
                "removed sandbox %s (%s) left by server pid %s", sandbox_id, runtime.name, pid
            )
            reaped.append(sandbox_id)
    return sorted(reaped)
