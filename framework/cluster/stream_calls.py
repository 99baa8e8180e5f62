"""The front door's side of a streamed run on a Ray device actor: its pieces handed to their
generations as they come, and a generation whose ``stop`` is set stopped on the node
(:mod:`~hetero.framework.cluster.streams` is the wire form and the actor's side)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from hetero.framework.cluster.stand_ins import CONTROL_GROUP
from hetero.framework.stage_plugin import Generation

__all__ = ["STOP_POLL_S", "follow"]

logger = logging.getLogger(__name__)

STOP_POLL_S = 0.05  # how soon a streamed generation's stop reaches its node, at most


def follow(
    ray: Any,
    actor: Any,
    pieces: Any,
    streams: dict[int, Generation],
    run_id: str,
    get: Callable[[Any], Any],
    on_silence: Callable[[], BaseException],
    timeout_s: float,
) -> Any:
    """A streamed run's answer; on the way each piece goes to its generation's ``on_piece``,
    and a generation whose ``stop`` is set is stopped on the node. ``get`` reads one piece
    (the host's call, with its timeout and its handling of a dead actor); no piece for
    ``timeout_s`` raises ``on_silence()``."""
    stopping: set[int] = set()

    def stop(item: int) -> None:
        stopping.add(item)
        call = actor.stop.options(concurrency_group=CONTROL_GROUP)
        call.remote(run_id, item)  # not waited for: its pieces end

    last = time.monotonic()
    try:
        while True:
            ready, _ = ray.wait([pieces], timeout=STOP_POLL_S)
            for item, job in streams.items():
                if item not in stopping and job.stop.is_set():
                    stop(item)
            if not ready:
                if time.monotonic() - last > timeout_s:
                    raise on_silence()
                continue
            last = time.monotonic()
            try:
                ref = next(pieces)
            except StopIteration:
                raise RuntimeError(f"{run_id}: a streamed run ended unanswered") from None
            event = get(ref)
            if event[0] == "done":
                return event[1]
            _, item, text = event
            streams[item].on_piece(text)
    except BaseException:  # nobody reads the rest: the node must not decode it for nobody
        for item in streams:
            if item not in stopping:
                try:
                    stop(item)
                except Exception:  # the actor is gone: nothing is decoding
                    logger.debug("stop of %s item %d not sent", run_id, item)
        raise
