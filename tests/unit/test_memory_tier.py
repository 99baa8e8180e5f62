"""The memory tier's W-TinyLFU policy: scan resistance, recency, byte bound, expiry."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from hetero.cache.memory_tier import FrequencySketch, MemoryTier


def digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=32).digest()


class Lru:
    """The control: plain LRU over the same number of entries."""

    def __init__(self, entries: int) -> None:
        self.entries: OrderedDict[bytes, str] = OrderedDict()
        self.limit = entries

    def get(self, key: bytes, now: float) -> str | None:
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
        return value

    def put(self, key: bytes, value: str, size: int, expires_at: float) -> bool:
        self.entries[key] = value
        while len(self.entries) > self.limit:
            self.entries.popitem(last=False)
        return True


def test_a_hot_entry_survives_a_scan_that_lru_flushes() -> None:
    tier, lru = MemoryTier(max_bytes=10), Lru(10)
    hot = digest("hot")
    for policy in (tier, lru):
        for _ in range(5):
            if policy.get(hot, 0.0) is None:
                policy.put(hot, "v", 1, 1e9)
    for index in range(200):  # a scan of one-off content
        cold = digest(f"cold-{index}")
        for policy in (tier, lru):
            if policy.get(cold, 0.0) is None:
                policy.put(cold, "v", 1, 1e9)
    assert tier.get(hot, 0.0) == "v"
    assert lru.get(hot, 0.0) is None  # the control: plain LRU lost it
    assert tier.rejections > 0


def test_recent_content_asked_again_soon_is_kept_like_lru_keeps_it() -> None:
    # Each key is asked for twice, 20 requests apart, never again: only recency helps. A pure
    # frequency filter refuses the newcomers; the window grows until the second asks hit.
    tier, lru = MemoryTier(max_bytes=100), Lru(100)
    hits = {"tier": 0, "lru": 0}
    stream = []
    for block in range(400):
        keys = [digest(f"r-{block}-{i}") for i in range(20)]
        stream += keys + keys
    for key in stream:
        for name, policy in (("tier", tier), ("lru", lru)):
            if policy.get(key, 0.0) is not None:
                hits[name] += 1
            else:
                policy.put(key, "v", 1, 1e9)
    assert hits["lru"] == len(stream) // 2  # the control: every second ask hits in LRU
    assert hits["tier"] >= 0.9 * hits["lru"]
    assert tier.window_max > 0.2 * tier.max_bytes  # the window grew from its 1 %


def test_the_tier_stays_within_its_byte_budget_with_values_of_many_sizes() -> None:
    tier = MemoryTier(max_bytes=10_000)
    for index in range(5000):
        size = 1 + (index * 7919) % 900
        key = digest(f"s-{index}")
        if tier.get(key, 0.0) is None:
            tier.put(key, index, size, 1e9)
        if index % 3 == 0:
            tier.get(digest(f"s-{index // 2}"), 0.0)
        assert tier.size_bytes <= tier.max_bytes
    held = [
        key for key in (digest(f"s-{i}") for i in range(5000)) if tier.get(key, 0.0) is not None
    ]
    assert 0 < len(held) == len(tier)
    assert not tier.put(digest("too-large"), 0, 10_001, 1e9)


def test_expired_entries_are_misses_and_leave() -> None:
    tier = MemoryTier(max_bytes=100)
    key = digest("ttl")
    tier.put(key, "v", 10, expires_at=5.0)
    assert tier.get(key, 4.0) == "v"
    assert tier.get(key, 5.0) is None
    assert len(tier) == 0 and tier.size_bytes == 0


def test_delete_and_clear() -> None:
    tier = MemoryTier(max_bytes=100)
    keys = [digest(f"d-{i}") for i in range(5)]
    for key in keys:
        tier.put(key, "v", 10, 1e9)
    tier.delete(keys[0])
    assert tier.get(keys[0], 0.0) is None and tier.get(keys[1], 0.0) == "v"
    tier.clear()
    assert len(tier) == 0 and tier.size_bytes == 0 and tier.get(keys[1], 0.0) is None


def test_the_sketch_counts_after_the_doorkeeper_and_halves() -> None:
    sketch = FrequencySketch(64)
    key_hash = int.from_bytes(digest("k")[:9], "little")
    slots = sketch.slots(key_hash)
    assert sketch.frequency(key_hash, slots) == 0
    sketch.increment(key_hash, slots)
    assert sketch.frequency(key_hash, slots) == 1  # the doorkeeper alone
    for _ in range(30):
        sketch.increment(key_hash, slots)
    assert sketch.frequency(key_hash, slots) == 16  # 15 in the counters (capped) + doorkeeper
    other = int.from_bytes(digest("other")[:9], "little")
    for _ in range(sketch.sample):
        sketch.increment(other, sketch.slots(other))
    assert sketch.frequency(key_hash, slots) < 16  # aged: halved, doorkeeper cleared


def test_the_steering_grows_the_window_when_lru_would_hit_more_and_shrinks_it_otherwise() -> None:
    from hetero.cache.window_steering import GROW, MIN_PERIOD, WindowSteering

    steering = WindowSteering(max_bytes=6400, entries=100)  # small: every key is sampled
    assert steering.mask == 0
    keys = [digest(f"w-{i}") for i in range(10)]
    changes = []
    for round_ in range(2 * MIN_PERIOD):  # LRU (the shadow) hits every repeat; the tier never
        key = keys[round_ % len(keys)]
        changes.append(steering.request(key, 64, tier_hit=False))
    assert GROW * int(0.0625 * 6400) in changes
    assert all(change >= 0 for change in changes)
    changes = [steering.request(key, 64, tier_hit=True) for key in keys * MIN_PERIOD]
    assert -int(0.0625 * 6400) in changes  # the tier hit at least as often: it shrinks
    assert all(change <= 0 for change in changes)


def test_the_fixed_start_reference_leading_lru_steps_the_window_back() -> None:
    from hetero.cache.window_steering import FixedReference, WindowSteering

    # A shadow of 20 entries; 5 hot keys each asked once a round, then 20 one-off keys: LRU
    # loses the hot keys to the one-offs every round, a frequency filter keeps them. The tier
    # agrees with LRU on every request (its own comparison finds nothing), so only the
    # reference (the tier as it was at its 1 % start) can say that the start does better.
    hot = [digest(f"hot-{i}") for i in range(5)]
    rounds = [[*hot, *(digest(f"once-{r}-{j}") for j in range(20))] for r in range(10)]

    def changes(with_reference: bool) -> tuple[list[int], WindowSteering]:
        steering = WindowSteering(max_bytes=64 * 20, entries=20)
        assert steering.mask == 0
        if with_reference:
            budget = steering.budget
            steering.start_reference(
                FixedReference(budget, 64, int(0.6 * (budget - 64)), lambda d: 10 * (d in hot))
            )
        seen = []
        for keys in rounds:
            for key in keys:
                lru_hit = key in steering.shadow
                seen.append(steering.request(key, 64, tier_hit=lru_hit))
        return seen, steering

    stepped, steering = changes(with_reference=True)
    assert -int(0.0625 * 64 * 20) in stepped  # one step back, not a jump
    assert all(change in (0, -int(0.0625 * 64 * 20)) for change in stepped)
    assert steering.reference_hits > steering.reference_lru_hits
    assert not steering.recency
    control, _ = changes(with_reference=False)  # the control: no reference, no change
    assert all(change == 0 for change in control)


def test_the_reference_runs_only_while_the_window_is_above_its_start() -> None:
    entries = 1000
    tier = MemoryTier(64 * entries)
    start = tier.window_max
    built = 0
    keys = _recency_stream(0, 8000, gap=entries // 4) + _frequency_stream(30_000, entries // 2, 2)
    for key in keys:
        if tier.get(key, 0.0) is None:
            tier.put(key, "v", 64, 1e18)
        steering = tier._steering
        if steering is not None:
            assert (steering.reference is None) == (tier.window_max <= start)
            built += steering.reference is not None
    assert built  # the recency phase took the window above its start


def test_large_tiers_shadow_a_sample_of_the_keys() -> None:
    from hetero.cache.window_steering import TARGET, WindowSteering

    steering = WindowSteering(max_bytes=64 * 50 * TARGET, entries=50 * TARGET)
    sampled = sum(not digest(f"s-{i}")[8] & steering.mask for i in range(20_000))
    assert 2**steering.shift == 32
    assert 20_000 / 32 * 0.8 < sampled < 20_000 / 32 * 1.2


def _check_queues(tier: MemoryTier) -> None:
    """Every entry is in the one queue it names, each queue's bytes are its entries' sizes,
    and the tier is within its budget."""
    from hetero.cache.memory_queues import QUEUE, SIZE

    held = 0
    for index, queue in enumerate(tier._queues):
        assert all(entry[QUEUE] == index for entry in queue.values())
        assert tier._bytes[index] == sum(entry[SIZE] for entry in queue.values())
        held += len(queue)
    assert held == len(tier) and tier.size_bytes == sum(tier._bytes) <= tier.max_bytes


def test_full_tier_writes_keep_the_queues_and_their_bytes_exact() -> None:
    # Writes on a full tier take the inlined path: one candidate (the window's oldest, or a new
    # entry larger than the window) or several (a large entry pushes out small ones), duels
    # that evict, rejections that put the victim back at probation's head, overwrites.
    tier = MemoryTier(max_bytes=2_000)
    keys = [digest(f"f-{i}") for i in range(300)]
    for step in range(6_000):
        key = keys[(step * step) % 97 if step % 3 else step % len(keys)]
        if tier.get(key, 0.0) is None or step % 11 == 0:
            tier.put(key, step, 1 + (step * 7919) % 150, 1e9)
        if step % 50 == 0:
            _check_queues(tier)
    _check_queues(tier)
    assert tier.rejections > 0 and tier.evictions > tier.rejections


def test_a_lost_duel_leaves_the_victim_first_in_probation() -> None:
    tier = MemoryTier(max_bytes=100)
    hot = [digest(f"h-{i}") for i in range(100)]
    for _ in range(3):  # every entry asked for three times: they outrank one-offs
        for key in hot:
            if tier.get(key, 0.0) is None:
                tier.put(key, "v", 1, 1e9)
    lost = 0
    for index in range(50):
        head = next(iter(tier._probation), None)
        rejections = tier.rejections
        one_off = digest(f"one-off-{index}")
        tier.put(one_off, "v", 1, 1e9)
        if tier.rejections > rejections and head is not None:
            lost += 1
            assert next(iter(tier._probation)) == head  # the victim kept its place
        _check_queues(tier)
    assert lost > 0


def test_the_first_fill_enters_the_main_space_oldest_first() -> None:
    # Before the tier is full nothing is evicted, but what falls out of the window must still
    # reach probation in arrival order: the oldest there is the first victim once it is full.
    # (Held in the window until the first eviction, the overflow left it newest first, and the
    # fill's newest entries were the first to go.)
    tier = MemoryTier(max_bytes=1_000)
    keys = [digest(f"fill-{i}") for i in range(900)]
    for key in keys:
        assert tier.put(key, "v", 1, 1e9)
    assert len(tier._window) <= tier.window_max < 100
    _check_queues(tier)
    main = list(tier._probation) + list(tier._protected)
    assert main == keys[: len(main)] and len(main) >= 800  # in arrival order, oldest first


def test_a_wider_sketch_keeps_every_held_keys_count() -> None:
    from hetero.cache.memory_queues import HASH, SLOT0, SLOT3

    tier = MemoryTier(max_bytes=10_000)
    hot = [digest(f"hot-{i}") for i in range(3)]
    for key in hot:
        tier.put(key, "v", 1, 1e9)
        for _ in range(5):
            assert tier.get(key, 0.0) is not None
    tier._drain()

    def counts() -> list[int]:
        sketch = tier._sketch
        return [
            sketch.frequency(entry[HASH], tuple(entry[SLOT0 : SLOT3 + 1]))
            for entry in (tier._data[key] for key in hot)
        ]

    before, width = counts(), tier._sketch.width
    assert before == [6, 6, 6]  # five hits in the counters, the write in the doorkeeper
    for index in range(width):  # enough entries to want a wider sketch
        tier.put(digest(f"more-{index}"), "v", 1, 1e9)
    assert tier._sketch.width > width
    assert counts() == before


def _replay_checking_bounds(tier: MemoryTier, keys: list[bytes]) -> float:
    """Get-or-put every key (64-byte entries); the window stays within [1 byte, the budget]
    after every request. The hit rate."""
    hits = 0
    for key in keys:
        if tier.get(key, 0.0) is not None:
            hits += 1
        else:
            tier.put(key, "v", 64, 1e18)
        assert 1 <= tier.window_max <= tier.max_bytes
    return hits / len(keys)


def _recency_stream(start: int, requests: int, gap: int) -> list[bytes]:
    """Every key asked for twice, ``gap`` requests apart, never again: LRU holding more than
    ``gap`` entries hits every second request, a frequency filter refuses them all (a key seen
    once is never more frequent than what it would evict)."""
    keys: list[bytes] = []
    for step in range(start, start + requests):
        keys.append(digest(f"r-{step}"))
        keys.append(digest(f"r-{step - gap}") if step - gap >= start else digest(f"o-{step}"))
    return keys


def _frequency_stream(requests: int, hot: int, seed: int) -> list[bytes]:
    """A hot set asked for one request in four, uniformly, among one-off keys: LRU holding
    fewer entries than the one-offs between two requests for a hot key never hits it; a
    frequency filter keeps the hot set."""
    import random

    rng = random.Random(seed)
    return [
        digest(f"h-{rng.randrange(hot)}") if rng.random() < 0.25 else digest(f"x-{seed}-{step}")
        for step in range(requests)
    ]


def test_the_window_moves_toward_recency_then_toward_frequency_and_stays_in_bounds() -> None:
    entries = 2000
    tier = MemoryTier(64 * entries)
    start = tier.window_max
    assert start == int(0.01 * 64 * entries)
    # A recency stream: LRU would hit half the requests, the tier with its 1 % window none of
    # the second ones it cannot hold: the window grows toward the whole tier.
    recency = _recency_stream(0, 20_000, gap=entries // 4)
    rate = _replay_checking_bounds(tier, recency)
    grown = tier.window_max
    assert grown >= 0.5 * tier.max_bytes, grown
    lru_rate = _replay_checking_bounds_lru(Lru(entries), recency)
    fixed_rate = _replay_checking_bounds(MemoryTier(64 * entries, adaptive=False), recency)
    assert rate > fixed_rate + 0.2 and rate > lru_rate - 0.1, (rate, lru_rate, fixed_rate)
    # A frequency stream: the window shrinks back toward its floor, and the tier keeps the hot
    # set that LRU loses to the one-offs.
    frequency = _frequency_stream(60_000, hot=entries // 2, seed=1)
    rate = _replay_checking_bounds(tier, frequency)
    assert tier.window_max <= 0.1 * tier.max_bytes < grown, tier.window_max
    lru_rate = _replay_checking_bounds_lru(Lru(entries), frequency)
    assert rate > lru_rate + 0.05, (rate, lru_rate)


def _replay_checking_bounds_lru(lru: Lru, keys: list[bytes]) -> float:
    hits = 0
    for key in keys:
        if lru.get(key, 0.0) is not None:
            hits += 1
        else:
            lru.put(key, "v", 64, 1e18)
    return hits / len(keys)


def test_a_fixed_window_stays_at_its_first_share() -> None:
    tier = MemoryTier(64 * 2000, adaptive=False)
    start = tier.window_max
    _replay_checking_bounds(tier, _recency_stream(0, 10_000, gap=500))
    assert tier.window_max == start
