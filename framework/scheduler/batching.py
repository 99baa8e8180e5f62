"""Batching per (stage, device): up to ``max_batch`` items or ``max_delay``, whichever first."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["Batcher"]

T = TypeVar("T")


@dataclass(slots=True)
class Batcher(Generic[T]):
    """Collects items for one (stage, device) and says when a batch is due."""

    max_batch: int
    max_delay_s: float
    _items: deque[tuple[float, T]] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: T, now: float) -> None:
        """Queue one item."""
        self._items.append((now, item))

    def due_at(self) -> float | None:
        """When the oldest item's delay runs out (None when empty)."""
        return self._items[0][0] + self.max_delay_s if self._items else None

    def ready(self, now: float) -> bool:
        """A full batch is waiting, or the oldest item has waited ``max_delay``."""
        if not self._items:
            return False
        return len(self._items) >= self.max_batch or now >= self._items[0][0] + self.max_delay_s

    def take(self, now: float) -> list[T]:
        """Up to ``max_batch`` items, oldest first, if a batch is ready; else nothing."""
        if not self.ready(now):
            return []
        count = min(self.max_batch, len(self._items))
        return [self._items.popleft()[1] for _ in range(count)]
