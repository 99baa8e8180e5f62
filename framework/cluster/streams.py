"""Streamed generation across processes: a :class:`Generation`'s pieces from a Ray device
actor back to the front door, and its stop the other way.

A ``Generation`` carries a callback (``on_piece``) and a ``threading.Event`` (``stop``) that
live in the front door and cannot cross to a node. The front door sends a
:class:`WireGeneration` instead (the request without them); the actor rebuilds a
``Generation`` whose ``on_piece`` puts each piece on a queue and whose ``stop`` it keeps by
(run id, item), and its ``run`` (a streaming generator method, ``num_returns="streaming"``)
yields ``("piece", item, text)`` as they come and ``("done", answer)`` at the end. The front
door's host calls the real ``on_piece`` for each piece and, when the real ``stop`` is set (a
client that left, the engine closing), asks the actor to set its copy (``stop`` call): the
plugin ends the generation as it would in one process, and its result says so. Knows nothing of
Ray.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetero.framework.stage_plugin import Generation

__all__ = ["PieceQueue", "WireGeneration", "on_wire"]


@dataclass(frozen=True, slots=True)
class WireGeneration:
    """A :class:`Generation` without what cannot leave the front door."""

    messages: tuple[Mapping[str, str], ...]
    max_tokens: int
    temperature: float
    seed: int | None
    stop_sequences: tuple[str, ...]

    @classmethod
    def of(cls, job: Generation) -> WireGeneration:
        """The request of ``job``, for a node."""
        return cls(
            tuple(dict(m) for m in job.messages),
            job.max_tokens,
            job.temperature,
            job.seed,
            tuple(job.stop_sequences),
        )

    def rebuild(self, on_piece: Callable[[str], None], stop: threading.Event) -> Generation:
        """The ``Generation`` the plugin runs on the node."""
        return Generation(
            list(self.messages),
            self.max_tokens,
            self.temperature,
            self.seed,
            on_piece,
            stop,
            self.stop_sequences,
        )


def on_wire(payloads: Sequence[Any]) -> tuple[list[Any], dict[int, Generation]]:
    """``payloads`` as they can travel to a node, and the streamed ones by position."""
    streams = {i: p for i, p in enumerate(payloads) if isinstance(p, Generation)}
    wire = [WireGeneration.of(p) if i in streams else p for i, p in enumerate(payloads)]
    return wire, streams


class PieceQueue:
    """A run on the node whose generations stream: their pieces, in order, while ``work``
    runs on a thread of its own; then its answer (or its exception, raised)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[int, str] | None] = queue.SimpleQueue()
        self.stops: dict[int, threading.Event] = {}

    def jobs(self, payloads: list[Any]) -> list[Any]:
        """``payloads`` with each :class:`WireGeneration` rebuilt to stream here."""
        out = list(payloads)
        for index, payload in enumerate(payloads):
            if isinstance(payload, WireGeneration):
                stop = self.stops.setdefault(index, threading.Event())
                out[index] = payload.rebuild(functools.partial(self._put, index), stop)
        return out

    def _put(self, index: int, text: str) -> None:
        self._queue.put((index, text))

    def follow(self, work: Callable[[], Any]) -> Iterator[tuple[Any, ...]]:
        """``("piece", item, text)`` for each piece, then ``("done", work())``."""
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["answer"] = work()
            except BaseException as err:  # raised again on the caller's side, below
                outcome["error"] = err
            finally:
                self._queue.put(None)

        thread = threading.Thread(target=run, name="hetero-stream", daemon=True)
        thread.start()
        while (piece := self._queue.get()) is not None:
            yield ("piece", *piece)
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        yield ("done", outcome["answer"])
