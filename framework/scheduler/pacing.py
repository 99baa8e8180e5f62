"""What admission needs to know of each stage: how fast it runs (paces measured per variant, per
item and per unit of complexity) and who holds its queue (requests outstanding per principal,
and the fair share of each).

Estimates come from the stage's own runs, never from other clients' request sizes: a pace is
seconds per item or per complexity unit, so a stream of tiny requests can only make the
estimate of a large one more cautious, never turn a normal one away.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

__all__ = ["FAIR_SHARE_FLOOR", "Pace", "Shares"]

SMOOTHING = 0.2
FAIR_SHARE_FLOOR = 4  # a caller may always hold this many requests of a stage


@dataclass
class Pace:
    """Run time of one stage variant, as moving averages of its batches."""

    item_s: float = 0.0  # seconds per item (a batch's run over its items)
    unit_s: float = 0.0  # seconds per complexity unit (a batch's run over its tasks' units)

    def observe(self, run_s: float, items: int, units: float) -> None:
        """Fold in one batch."""
        if items > 0:
            self.item_s = _smooth(self.item_s, run_s / items)
        if units > 0:
            self.unit_s = _smooth(self.unit_s, run_s / units)

    def seed(self, run_s: float, items: int, units: float) -> None:
        """A warm-up probe's timing, before any batch: the fastest device's counts."""
        if items > 0 and (self.item_s == 0.0 or run_s / items < self.item_s):
            self.item_s = run_s / items
        if units > 0 and (self.unit_s == 0.0 or run_s / units < self.unit_s):
            self.unit_s = run_s / units

    def estimate_s(self, items: int, units: float) -> float | None:
        """A request's run time: by its complexity units where both are known, else by its
        items; None before the variant has run."""
        if units > 0 and self.unit_s > 0:
            return self.unit_s * units
        if self.item_s > 0:
            return self.item_s * max(1, items)
        return None


def _smooth(old: float, new: float) -> float:
    return new if old == 0.0 else old + SMOOTHING * (new - old)


class Shares:
    """Requests outstanding per (stage, principal): no caller may hold more than its share of
    a stage's queue while others wait, so one caller cannot make the server refuse the rest."""

    def __init__(self) -> None:
        self._held: Counter[tuple[str, str]] = Counter()

    def hold(self, stage: str, who: str) -> None:
        """``who`` has one more request of ``stage`` outstanding."""
        self._held[(stage, who)] += 1

    def release(self, stage: str, who: str) -> None:
        """One of ``who``'s requests of ``stage`` ended."""
        key = (stage, who)
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]

    def held(self, stage: str, who: str) -> int:
        """Requests of ``stage`` that ``who`` has outstanding."""
        return self._held.get((stage, who), 0)

    def share(self, stage: str, who: str, bound: int) -> int:
        """How many requests of ``stage`` ``who`` may hold: the class's queue ``bound`` split
        between it and every other caller holding some, and never more than half of it while
        alone (the other half stays for callers yet to come); at least the floor."""
        others = sum(1 for (s, w) in self._held if s == stage and w != who)
        return max(FAIR_SHARE_FLOOR, bound // max(2, others + 1))
