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

Devices that view one GPU (``cuda:0``, ``vllm:cuda:0``) run in one placement group, their
GPU's; the last of their actors to end removes it. Each that ends (its lease lapsed, or its
last front door left) first says so (``ended``), then asks its peers (:func:`peers_done`):
where every peer's actor is gone or ended, it removes the group; where one is in use or still
ending, it leaves the group to that one, which asks in turn once it ended, and finds this one
ended or gone. Of two that end at once, at least the later to ask removes it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from hetero.framework.cluster.lane_start import actor_name
from hetero.framework.cluster.stand_ins import CONTROL_GROUP

__all__ = ["CHECKS_PER_LEASE", "ENDED", "LAPSED", "LIVE", "Lease", "peers_done", "start_reaper"]

logger = logging.getLogger(__name__)

CHECKS_PER_LEASE = 4  # how often in one lease the actor looks whether a front door touched it
ASK_WAIT_S = 10.0  # how long a peer's actor may take to say whether it is in use
LIVE, LAPSED, ENDED = "live", "lapsed", "ended"  # a device actor's lease, as its peers see it


class Lease:
    """The front doors' lease on one device actor: who touched it when, and its calls in
    progress (a setup, a load or a run counts as a touch: a front door warming a joining device
    waits on its loads, and touches it only once it takes it)."""

    def __init__(self, lease_s: float, call_limit_s: float = 0.0) -> None:
        self.lease_s = lease_s
        # a call in progress for longer than this is hung, not a touch (0: every call counts)
        self.call_limit_s = call_limit_s
        self.ended = False  # closed for good: its lease lapsed, or its last front door left
        self._doors: dict[str, float] = {}  # the front doors sharing the actor: last touches
        self._calls: dict[int, float] = {}  # the calls in progress: when each began
        self._seen = time.monotonic()  # a front door's last touch (its start until one comes)
        self._lock = threading.Lock()

    def touch(self, door: str) -> None:
        """Front door ``door`` is there (its heartbeat, or its first use of the actor)."""
        with self._lock:
            self._doors[door] = self._seen = time.monotonic()

    def detach(self, door: str, lease_s: float) -> int:
        """Front door ``door`` leaves: how many others are still there (touched within
        ``lease_s``)."""
        now = time.monotonic()
        with self._lock:
            self._doors.pop(door, None)
            return sum(1 for seen in self._doors.values() if now - seen <= lease_s)

    def lapsed(self, now: float) -> bool:
        """Whether no front door touched the actor for longer than its lease, and no call is
        in progress there but one older than :attr:`call_limit_s` (a hung call keeps no
        actor, and its GPUs, once every front door died)."""
        with self._lock:
            if self.lease_s <= 0 or now - self._seen <= self.lease_s:
                return False
            limit = self.call_limit_s
            return not any(limit <= 0 or now - began <= limit for began in self._calls.values())

    def state(self, now: float) -> str:
        """The lease as the devices sharing the actor's GPU see it: ended, lapsed or live."""
        if self.ended:
            return ENDED
        return LAPSED if self.lapsed(now) else LIVE

    @contextlib.contextmanager
    def present(self) -> Iterator[None]:
        """A front door's call in progress: the lease holds while it runs and from its end."""
        token = object()
        with self._lock:
            self._calls[id(token)] = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                del self._calls[id(token)]
                self._seen = time.monotonic()


def start_reaper(
    fleet_id: str, lease: Lease, close: Callable[[], None], peers: Sequence[str] = ()
) -> threading.Thread:
    """Watch ``lease`` on a daemon thread of the actor's process; once it lapsed, ``close``
    the actor's plugins and end it (``peers``: the devices sharing its GPU's placement
    group)."""
    thread = threading.Thread(
        target=_watch,
        args=(fleet_id, lease, close, tuple(peers)),
        name=f"hetero-reap:{fleet_id}",
        daemon=True,
    )
    thread.start()
    return thread


def _watch(fleet_id: str, lease: Lease, close: Callable[[], None], peers: tuple[str, ...]) -> None:
    period = lease.lease_s / CHECKS_PER_LEASE
    while not lease.lapsed(time.monotonic()):
        time.sleep(period)  # the lease's own clock: a check's period, not synchronisation
    logger.warning("%s: no front door touched its actor for %g s; it ends", fleet_id, lease.lease_s)
    try:
        close()
    except Exception as err:  # its plugins failed to close: it ends regardless
        logger.warning("%s: closing its plugins: %s", fleet_id, err)
    lease.ended = True
    _end_self(peers)


def _end_self(peers: Sequence[str]) -> None:
    """End this actor's process for good (no restart): its placement group removed where it
    runs in one (a device group's, which frees the GPUs; a shared GPU's once its ``peers``
    are done with it), else killed."""
    import ray

    placement: Any = ray.util.get_current_placement_group()
    if placement is not None and (not peers or peers_done(ray, peers, None)):
        ray.util.remove_placement_group(placement)
    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


def peers_done(ray: Any, peers: Sequence[str], namespace: str | None) -> bool:
    """Whether the actors of every device in ``peers`` are gone or ended: then the one asking
    (ended itself) removes the placement group they share. False where one is in use, or
    lapsed and still ending (it asks in turn once it ended)."""
    for peer in peers:
        try:
            handle = ray.get_actor(actor_name(peer), namespace=namespace)
        except ValueError:  # none of that name: gone
            continue
        ask = handle.lease_state.options(concurrency_group=CONTROL_GROUP)
        try:
            state = ray.get(ask.remote(), timeout=ASK_WAIT_S)
        except ray.exceptions.GetTimeoutError:
            return False  # busy: in use
        except ray.exceptions.RayError:  # died meanwhile (killed, or its group removed)
            continue
        if state != ENDED:
            return False
    return True
