"""A shared device actor ends itself once no front door is there: the lease reaper.

Front doors share a device's actor (named, detached: it outlives the door that started it),
each touching it with its heartbeat and leaving it (``detach``) when it closes; the last to
leave closes it. A front door that crashed never leaves. Where it was the last, nothing would
end the actor, and a GPU actor would hold its GPU (and a device group its placement group)
until ``ray stop``. So the actor watches its own lease: once no front door has touched it for
longer than ``lease_s`` (the front doors' ``max(10 s, 5 heartbeats)``), it closes its stage
plugins and ends itself: a device group's actor removes its placement group (which ends the
actor and frees the GPUs), any other kills itself without a restart. A front door started
later starts a fresh actor, as at first use.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

__all__ = ["CHECKS_PER_LEASE", "start_reaper"]

logger = logging.getLogger(__name__)

CHECKS_PER_LEASE = 4  # how often in one lease the actor looks whether a front door touched it


class Leased(Protocol):
    """What the reaper reads of a device actor and ends."""

    fleet_id: str
    lease_s: float

    def lapsed(self, now: float) -> bool: ...

    def close(self) -> None: ...


def start_reaper(actor: Leased) -> threading.Thread:
    """Watch ``actor``'s lease on a daemon thread of its process; end it once it lapsed."""
    thread = threading.Thread(
        target=_watch, args=(actor,), name=f"hetero-reap:{actor.fleet_id}", daemon=True
    )
    thread.start()
    return thread


def _watch(actor: Leased) -> None:
    period = actor.lease_s / CHECKS_PER_LEASE
    while not actor.lapsed(time.monotonic()):
        time.sleep(period)  # the lease's own clock: a check's period, not synchronisation
    logger.warning(
        "%s: no front door touched its actor for %g s; it ends", actor.fleet_id, actor.lease_s
    )
    try:
        actor.close()
    except Exception as err:  # its plugins failed to close: it ends regardless
        logger.warning("%s: closing its plugins: %s", actor.fleet_id, err)
    _end_self()


def _end_self() -> None:
    """End this actor's process for good (no restart): its placement group removed where it
    runs in one (a device group's, which frees the GPUs), else killed."""
    import ray

    placement: Any = ray.util.get_current_placement_group()
    if placement is not None:
        ray.util.remove_placement_group(placement)
    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
