"""Per-device memory manager: what is resident, what may be evicted, counts of both.

Victims are idle models (no work in flight) older than their minimum residency, chosen by the
score ``idle seconds x bytes / reload seconds``: a large model that has been idle long and is
cheap to bring back goes first, so one large idle model is evicted before three small hot ones.
``eviction="lru"`` is plain least-recently-used with no minimum residency, kept for comparison
(the simulator's thrash scenario).
Victims are taken greedily by score until enough room is free; if idle models cannot free
enough, nothing is evicted and the caller places elsewhere.

Minimum residency is a preference, not a wall: a task that has waited its class's
``max_load_wait_s`` for room (``overdue``) may evict idle models however young, and if busy
models hold the room, :meth:`MemoryManager.drain_victims` names the ones to stop feeding so they
go idle (the scheduler's side of the starvation bound, docs/scheduler.md).

KV cache: a request to a model with a KV cache reserves its longest context (prompt plus
output tokens, in whole blocks of the paged allocator) when it is placed and gives it back
when it finishes; the reservation counts as used memory, so a device whose KV room is taken
is skipped or waited for (admission, never preemption).

One physical memory that several devices draw on (``cuda:0`` and ``vllm:cuda:0``; a host's
RAM under OpenVINO, ONNX Runtime and torch) is one budget: their managers share a
:class:`SharedMemory`, so what either holds leaves less room for both (each still evicts only
its own models, and keeps its own capacity as a cap inside the shared one).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["LoadPlan", "MemoryManager", "Residency", "SharedMemory", "share_memory"]

MIN_RELOAD_S = 1e-3


@dataclass(slots=True)
class Residency:
    """One resident model on one device."""

    key: str
    bytes: int
    reload_s: float
    loaded_at: float
    last_used: float
    min_residency_s: float
    in_flight: int = 0


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What making a model resident takes: evictions first, then a load (or nothing)."""

    key: str
    load: bool
    evict: tuple[str, ...] = ()


_STAY: dict[str, LoadPlan] = {}
"""Per model, the plan that changes nothing (it is resident and has room): immutable, so one
is shared rather than made per decision."""


@dataclass(slots=True)
class MemoryManager:
    """Memory of one device, in bytes: capacity after the policy's reserve."""

    device_id: str
    capacity: int
    eviction: str = "cost_aware"
    resident: dict[str, Residency] = field(default_factory=dict)
    loads: int = 0
    evictions: int = 0
    kv_reserved: int = 0
    """Bytes of KV cache reserved by requests placed here and not finished."""
    evicted: deque[tuple[str, float]] = field(default_factory=lambda: deque(maxlen=1024))
    """The latest evictions: (model key, seconds it had been resident)."""
    shared: SharedMemory | None = None
    """The physical device's memory, when other devices' managers draw on it too."""

    @property
    def model_bytes(self) -> int:
        """Bytes held by resident models."""
        return sum(r.bytes for r in self.resident.values())

    @property
    def used(self) -> int:
        """Bytes held by resident models and reserved KV cache."""
        return self.model_bytes + self.kv_reserved

    @property
    def free(self) -> int:
        """Bytes not held (by any device of the same physical memory)."""
        if self.shared is not None:
            return min(self.capacity - self.used, self.shared.capacity - self.shared.used)
        return self.capacity - self.used

    def _score(self, residency: Residency, now: float) -> float:
        return (now - residency.last_used) * residency.bytes / max(residency.reload_s, MIN_RELOAD_S)

    def _victims(
        self,
        needed: int,
        now: float,
        allow_young: frozenset[str] = frozenset(),
        overdue: bool = False,
        keep: str = "",
    ) -> tuple[str, ...] | None:
        if needed <= self.free:
            return ()
        if self.eviction == "lru":
            candidates = [r for r in self.resident.values() if r.in_flight == 0 and r.key != keep]
            candidates.sort(key=lambda r: r.last_used)
        else:
            candidates = [
                r
                for r in self.resident.values()
                if r.in_flight == 0
                and r.key != keep
                and (overdue or r.key in allow_young or now - r.loaded_at >= r.min_residency_s)
            ]
            candidates.sort(key=lambda r: self._score(r, now), reverse=True)
        freed = self.free
        chosen: list[str] = []
        for victim in candidates:
            if freed >= needed:
                break
            chosen.append(victim.key)
            freed += victim.bytes
        return tuple(chosen) if freed >= needed else None

    def next_evictable(self, now: float) -> float | None:
        """When the next idle model passes its minimum residency (None if none is waiting)."""
        times = [
            r.loaded_at + r.min_residency_s
            for r in self.resident.values()
            if r.in_flight == 0 and r.loaded_at + r.min_residency_s > now
        ]
        return min(times) if times else None

    def plan(
        self,
        key: str,
        size: int,
        now: float,
        *,
        allow_young: frozenset[str] = frozenset(),
        overdue: bool = False,
        kv_bytes: int = 0,
    ) -> LoadPlan | None:
        """What making ``key`` resident with ``kv_bytes`` of KV room takes, or None if no room
        can be made. Models named in ``allow_young`` (every model, when the task is
        ``overdue``) may go even inside their minimum residency."""
        resident = key in self.resident
        if resident and (not kv_bytes or kv_bytes <= self.free):
            stay = _STAY.get(key)
            if stay is None:
                stay = _STAY[key] = LoadPlan(key=key, load=False)
            return stay
        if size + kv_bytes > self.capacity:
            return None
        needed = kv_bytes + (0 if resident else size)
        victims = self._victims(needed, now, allow_young, overdue, keep=key)
        if victims is None:
            return None
        return LoadPlan(key=key, load=not resident, evict=victims)

    def drain_victims(self, size: int, now: float, keep: str = "") -> tuple[str, ...] | None:
        """Models that, once idle, free room for ``size`` bytes: idle ones first, then busy
        ones by score (an overdue task asks; the scheduler stops feeding them here). None if
        even every model gone would not make room."""
        if size > self.capacity:
            return None
        ranked = sorted(
            (r for r in self.resident.values() if r.key != keep),
            key=lambda r: (r.in_flight > 0, -self._score(r, now), r.key),
        )
        freed = self.free
        chosen: list[str] = []
        for victim in ranked:
            if freed >= size:
                break
            chosen.append(victim.key)
            freed += victim.bytes
        return tuple(chosen) if freed >= size else None

    def apply(
        self, plan: LoadPlan, size: int, reload_s: float, now: float, min_residency_s: float
    ) -> None:
        """Record ``plan`` as done: evictions removed, the model resident."""
        for victim in plan.evict:
            gone = self.resident.pop(victim, None)
            if gone is not None:
                self.evictions += 1
                self.evicted.append((victim, now - gone.loaded_at))
        if plan.load:
            self.resident[plan.key] = Residency(
                key=plan.key,
                bytes=size,
                reload_s=reload_s,
                loaded_at=now,
                last_used=now,
                min_residency_s=min_residency_s,
            )
            self.loads += 1

    def begin(self, key: str, now: float) -> None:
        """Work on ``key`` starts: it cannot be evicted until :meth:`end`."""
        residency = self.resident[key]
        residency.in_flight += 1
        residency.last_used = now

    def end(self, key: str, now: float) -> None:
        """Work on ``key`` finished."""
        residency = self.resident.get(key)
        if residency is not None:
            residency.in_flight = max(0, residency.in_flight - 1)
            residency.last_used = now


@dataclass(eq=False, slots=True)
class SharedMemory:
    """The memory of one physical device that several devices' managers draw on."""

    capacity: int
    members: list[MemoryManager] = field(default_factory=list)

    @property
    def used(self) -> int:
        """Bytes held by every member."""
        return sum(member.used for member in self.members)


def share_memory(managers: list[MemoryManager], physical_ids: Sequence[str]) -> list[MemoryManager]:
    """Give managers whose devices draw on one memory (``managers[i]`` has
    ``physical_ids[i]``, the device's :attr:`~hetero.framework.devices.DeviceSpec.memory_id`)
    one :class:`SharedMemory`, as large as the largest of their capacities: the physical
    memory, where a smaller capacity is a budget set for one runtime's view of it (a policy
    override), which that manager keeps as its own cap inside the shared one. A manager
    alone on its memory keeps its own. Returns ``managers``."""
    groups: defaultdict[str, list[MemoryManager]] = defaultdict(list)
    for manager, physical in zip(managers, physical_ids, strict=True):
        groups[physical].append(manager)
    for members in groups.values():
        shared = None
        if len(members) > 1:
            shared = SharedMemory(max(m.capacity for m in members), list(members))
        for manager in members:
            manager.shared = shared
    return managers
