"""One queue per stage, ordered by QoS weight plus waiting-time aging; O(log n) push and pop.

A task of class weight ``w`` that arrived at ``t0`` has, at time ``t``, the priority
``w + a * (t - t0)`` (``a`` = ``qos.aging_per_second``). The term ``a * t`` is shared by every
task at any instant, so the order never changes while tasks wait: a heap keyed once on
``w - a * t0`` (ties: earlier deadline, then arrival order) serves the highest current priority
first with O(log n) push and pop, and nothing is ever re-sorted.

**Starvation bound.** A task T of the lowest class (weight ``w_min``) that arrives at ``t0``
is overtaken only by tasks already queued at ``t0`` (at most ``B``, the sum of the queue bounds
of all classes) and by tasks arriving before ``t0 + D`` where ``D = (w_max - w_min) / a``; any
later arrival has a lower key. With a server completing ``mu`` tasks per second and ``A(t0, D)``
arrivals in ``(t0, t0 + D)``, T's wait is at most ``(B + A(t0, D) + 1) / mu``: the ``+ 1`` is
the task in service when T arrives.
At an arrival rate ``lambda`` that is about ``B / mu + lambda * D / mu``: bounded for any load,
and the property test in ``tests/unit/test_queue_starvation.py`` checks it on random arrival
mixes at twice the capacity. With ``a = 0`` there is no bound: the policy loader refuses
``aging_per_second: 0`` when class weights differ.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from hetero.framework.errors import QueueFullError
from hetero.framework.scheduler.tasks import StageTask

__all__ = ["LiveTally", "QueueClass", "StageQueue", "overtaking_window", "starvation_bound"]


@dataclass(frozen=True, slots=True)
class QueueClass:
    """A QoS class as the queue needs it."""

    weight: float
    bound: int


class LiveTally:
    """Live tasks over several queues (read-only outside them): a dispatch with every queue
    empty answers at once instead of asking each stage."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class StageQueue:
    """The queue of one stage (``tally``: shared with the other stages' queues, or its own)."""

    def __init__(
        self,
        stage: str,
        classes: Mapping[str, QueueClass],
        aging_per_second: float,
        tally: LiveTally | None = None,
    ) -> None:
        self.stage = stage
        self.tally = tally if tally is not None else LiveTally()
        self._classes = dict(classes)
        self._aging = aging_per_second
        self._heap: list[tuple[float, float, int, StageTask]] = []
        self._counts = dict.fromkeys(self._classes, 0)
        self.live = 0  # live tasks (read-only outside): the dispatch loop skips empty queues
        self.items = 0  # items of the live tasks: the work waiting, for admission's estimate
        self.units = 0.0  # their complexity units (admission's other measure of that work)
        # The next live task's key (None: empty), read-only outside: the dispatch loop compares
        # every stage's per decision. The heap's top is kept live (cancelled ones dropped).
        self.head: float | None = None
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return self.live

    def count(self, qos_class: str) -> int:
        """Queued tasks of one class."""
        return self._counts.get(qos_class, 0)

    def key(self, task: StageTask) -> float:
        """The time-invariant part of the task's priority (higher is served first)."""
        return self._classes[task.qos_class].weight - self._aging * task.arrival

    def push(self, task: StageTask) -> None:
        """Queue ``task``; :class:`QueueFullError` if its class is at its bound."""
        queue_class = self._classes.get(task.qos_class)
        if queue_class is None:
            raise KeyError(f"unknown QoS class {task.qos_class!r}")
        if self._counts[task.qos_class] >= queue_class.bound:
            raise QueueFullError(self.stage, task.qos_class, queue_class.bound)
        heap = self._heap
        heapq.heappush(heap, (-self.key(task), task.deadline, next(self._sequence), task))
        self.head = -heap[0][0]
        task.cancelled = False
        task.queued = True
        self._counts[task.qos_class] += 1
        self.live += 1
        self.tally.count += 1
        self.items += task.items
        self.units += task.units

    def _drop_cancelled(self) -> None:
        """Drop cancelled tasks off the top and note the new head's key."""
        heap = self._heap
        while heap and heap[0][3].cancelled:
            heapq.heappop(heap)  # already taken off the counts by cancel()
        self.head = -heap[0][0] if heap else None

    def pop(self) -> StageTask | None:
        """Take the task with the highest current priority."""
        if not self._heap:
            return None
        task = heapq.heappop(self._heap)[3]
        self._drop_cancelled()
        task.queued = False
        self._counts[task.qos_class] -= 1
        self.live -= 1
        self.tally.count -= 1
        self.items -= task.items
        self.units -= task.units
        return task

    def cancel(self, task: StageTask) -> None:
        """Cancel ``task``: it stops counting against its class's bound at once and is dropped
        from the heap when it reaches the head."""
        if task.queued and not task.cancelled:
            self._counts[task.qos_class] -= 1
            self.live -= 1
            self.tally.count -= 1
            self.items -= task.items
            self.units -= task.units
            task.queued = False
        task.cancelled = True
        heap = self._heap
        if heap and heap[0][3] is task:  # the head stays live
            self._drop_cancelled()


def starvation_bound(total_queue_bound: int, arrivals_in_window: int, service_rate: float) -> float:
    """The bound above: the longest a lowest-class task can wait, in seconds."""
    return (total_queue_bound + arrivals_in_window + 1) / service_rate


def overtaking_window(weights: Mapping[str, float], aging_per_second: float) -> float:
    """``D``: how long after a lowest-class arrival other arrivals can still overtake it."""
    values = list(weights.values())
    return (max(values) - min(values)) / aging_per_second if aging_per_second > 0 else float("inf")
