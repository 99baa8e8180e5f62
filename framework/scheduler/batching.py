"""Batching per (stage, device): up to ``max_batch`` items or ``max_delay``, whichever first."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["Batcher"]

T = TypeVar("T")


@dataclass(slots=True)
class Batcher(Generic[T]):
    """Collects entries for one (stage, device) and says when a batch is due.

    ``size`` counts the model inputs an entry holds (a task of a request in parts holds
    several): a batch holds up to ``max_batch`` of them; by default every entry is one.
    """

    max_batch: int
    max_delay_s: float
    size: Callable[[T], int] | None = None
    _items: deque[tuple[float, T]] = field(default_factory=deque)
    _held: int = 0  # inputs of the entries queued

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: T, now: float) -> None:
        """Queue one entry."""
        self._items.append((now, item))
        self._held += 1 if self.size is None else self.size(item)

    def due_at(self) -> float | None:
        """When the oldest item's delay runs out (None when empty)."""
        return self._items[0][0] + self.max_delay_s if self._items else None

    def ready(self, now: float) -> bool:
        """A full batch is waiting, or the oldest item has waited ``max_delay``."""
        if not self._items:
            return False
        return self._held >= self.max_batch or now >= self._items[0][0] + self.max_delay_s

    def take(self, now: float) -> list[T]:
        """Entries holding up to ``max_batch`` inputs (at least one entry), oldest first, if
        a batch is ready; else nothing."""
        if not self.ready(now):
            return []
        size = self.size
        if size is None:
            count = min(self.max_batch, len(self._items))
            self._held -= count
            return [self._items.popleft()[1] for _ in range(count)]
        batch = [self._items.popleft()[1]]
        held = size(batch[0])
        while self._items and held + size(self._items[0][1]) <= self.max_batch:
            batch.append(self._items.popleft()[1])
            held += size(batch[-1])
        self._held -= held
        return batch
