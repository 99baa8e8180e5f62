"""`hetero bench cache`'s timed alternation: no action always follows the same one."""

from __future__ import annotations

from collections.abc import Callable

from hetero.framework.bench import cache_timing as bench


def test_each_action_follows_every_other_and_is_timed_reads_times() -> None:
    calls: list[str] = []

    def action(name: str) -> Callable[[], None]:
        return lambda: calls.append(name)

    names = ["a", "b", "c", "d"]
    reads = 200
    figures = bench._timed_together(*(action(name) for name in names), reads=reads)
    assert len(figures) == len(names)
    timed = calls[200 * len(names) :]  # after the warm-up's fixed passes
    assert len(timed) == reads * len(names)
    for name in names:
        assert timed.count(name) == reads
        before = {timed[i - 1] for i in range(1, len(timed)) if timed[i] == name}
        # In a fixed cycle (the control) each action has one predecessor and inherits what it
        # left in the CPU's caches; drawn orders give it every other action.
        assert before >= set(names) - {name}
