"""The lowest class is delayed but never starved: the bound stated in queues.py, checked on
random arrival mixes at twice the service capacity (hypothesis)."""

from __future__ import annotations

import bisect
import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.framework.errors import QueueFullError
from hetero.framework.scheduler.queues import (
    QueueClass,
    StageQueue,
    overtaking_window,
    starvation_bound,
)
from hetero.framework.scheduler.tasks import StageTask

WEIGHTS = {"interactive": 8.0, "standard": 4.0, "batch": 1.0}
SERVICE_S = 0.01  # one server, 100 tasks/s
BOUND = 40


def task(qos: str, arrival: float) -> StageTask:
    return StageTask("r", "s", "s", "full", qos, arrival=arrival, deadline=arrival + 1.0)


arrival_mixes = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=2 * SERVICE_S / 2),  # mean gap ~ half a service time
        st.sampled_from(sorted(WEIGHTS)),
    ),
    min_size=50,
    max_size=600,
)


def serve(
    arrivals: list[tuple[float, str]], aging: float
) -> tuple[list[float], list[tuple[float, float]]]:
    """One server draining one stage queue; returns arrival times and (arrival, wait) of every
    served lowest-class task."""
    classes = {name: QueueClass(weight, BOUND) for name, weight in WEIGHTS.items()}
    queue = StageQueue("s", classes, aging_per_second=aging)
    times: list[float] = []
    now = 0.0
    for gap, _ in arrivals:
        now += gap
        times.append(now)
    pending = list(zip(times, (qos for _, qos in arrivals), strict=True))
    server_free = 0.0
    index = 0
    waits: list[tuple[float, float]] = []
    while index < len(pending) or len(queue):
        next_arrival = pending[index][0] if index < len(pending) else float("inf")
        if len(queue) and server_free <= next_arrival:
            served = queue.pop()
            assert served is not None
            start = max(server_free, served.arrival)
            if served.qos_class == "batch":
                waits.append((served.arrival, start - served.arrival))
            server_free = start + SERVICE_S
            continue
        arrival, qos = pending[index]
        index += 1
        with contextlib.suppress(QueueFullError):
            queue.push(task(qos, arrival))
    return times, waits


def violations(times: list[float], waits: list[tuple[float, float]], aging: float) -> int:
    """Lowest-class waits above the stated bound."""
    window = overtaking_window(WEIGHTS, aging)
    total_bound = BOUND * len(WEIGHTS)
    count = 0
    for arrival, wait in waits:
        in_window = bisect.bisect_right(times, arrival + window) - bisect.bisect_right(
            times, arrival
        )
        if wait > starvation_bound(total_bound, in_window, 1 / SERVICE_S) + 1e-9:
            count += 1
    return count


@settings(max_examples=60, deadline=None)
@given(arrivals=arrival_mixes, aging=st.sampled_from([0.5, 2.0, 20.0, 200.0]))
def test_lowest_class_wait_stays_within_the_bound(
    arrivals: list[tuple[float, str]], aging: float
) -> None:
    times, waits = serve(arrivals, aging)
    assert violations(times, waits, aging) == 0


def test_the_bound_is_not_vacuous_strict_priority_breaks_it() -> None:
    # Two seconds at twice the capacity: a batch task every 20th arrival, the rest interactive.
    arrivals = [(SERVICE_S / 2, "batch" if i % 20 == 0 else "interactive") for i in range(400)]
    times, waits = serve(arrivals, aging=200.0)
    assert violations(times, waits, aging=200.0) == 0
    strict_times, strict_waits = serve(arrivals, aging=1e-9)  # practically no aging
    # Judged by the bound of the aged queue, strict priority starves the batch class.
    assert violations(strict_times, strict_waits, aging=200.0) > 0
    assert max(w for _, w in strict_waits) > 2 * max(w for _, w in waits)


def test_aging_lets_an_old_low_task_overtake_new_high_ones() -> None:
    classes = {name: QueueClass(weight, BOUND) for name, weight in WEIGHTS.items()}
    queue = StageQueue("s", classes, aging_per_second=1.0)
    queue.push(task("batch", arrival=0.0))  # key 1 - 0 = 1
    queue.push(task("interactive", arrival=5.0))  # key 8 - 5 = 3: newer but higher
    queue.push(task("interactive", arrival=10.0))  # key 8 - 10 = -2: younger than the batch one
    order = [queue.pop().arrival for _ in range(3)]  # type: ignore[union-attr]
    assert order == [5.0, 0.0, 10.0]


def test_queue_bounds_shed_per_class_and_cancelled_tasks_vanish() -> None:
    classes = {"a": QueueClass(1.0, 2), "b": QueueClass(1.0, 5)}
    queue = StageQueue("s", classes, aging_per_second=1.0)
    first = task("a", 0.0)
    queue.push(first)
    queue.push(task("a", 1.0))
    try:
        queue.push(task("a", 2.0))
        raise AssertionError("the bound was not enforced")
    except QueueFullError as err:
        assert (err.stage, err.qos_class, err.bound, err.status) == ("s", "a", 2, 429)
    queue.push(task("b", 2.0))  # the other class still has room
    queue.cancel(first)
    assert queue.pop() is not first
    assert len(queue) == 1


def test_the_head_is_always_the_next_live_tasks_key() -> None:
    classes = {name: QueueClass(weight, BOUND) for name, weight in WEIGHTS.items()}
    queue = StageQueue("s", classes, aging_per_second=1.0)
    assert queue.head is None
    low, middle, high = task("batch", 0.0), task("standard", 0.0), task("interactive", 0.0)
    for each in (low, middle, high):
        queue.push(each)
    assert queue.head == queue.key(high)
    queue.cancel(middle)  # buried: the head stays
    assert queue.head == queue.key(high)
    queue.cancel(high)  # the head: the next live one (not the cancelled middle) takes its place
    assert queue.head == queue.key(low) and queue.live == 1
    assert queue.pop() is low
    assert queue.head is None and queue.live == 0 and queue.pop() is None
    queue.push(middle)  # pushed again after its cancel: live once more
    assert queue.head == queue.key(middle) and queue.pop() is middle
