"""The memory tier's window on a stream whose hit rate drifts while what pays stays the same.

A climber that compares each period with the one before (Caffeine's) reads a rising hit rate as
its last move paying and keeps moving the same way, whatever the window did: on the Mooncake
trace that walked it to one end (docs/cache.md). The steering compares the tier with a shadow
LRU on the same requests in the same period, so a drift in the base rate reads as nothing.
"""

from __future__ import annotations

import hashlib
import random

import pytest

from hetero.cache.memory_tier import MemoryTier

ENTRIES = 2000


def digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=32).digest()


def drifting_frequency_stream(requests: int, rising: bool, seed: int) -> list[bytes]:
    """A hot set of ``ENTRIES // 2`` keys among one-off keys; the hot share of the requests
    moves from 5 to 60 % across the stream (or back): the hit rate any policy gets drifts with
    it, and keeping the hot set (frequency, a small window) pays throughout."""
    rng = random.Random(seed)
    keys = []
    for step in range(requests):
        progress = step / requests if rising else 1 - step / requests
        hot_share = 0.05 + 0.55 * progress
        if rng.random() < hot_share:
            keys.append(digest(f"hot-{rng.randrange(ENTRIES // 2)}"))
        else:
            keys.append(digest(f"once-{seed}-{step}"))
    return keys


def replay(tier: MemoryTier, keys: list[bytes]) -> tuple[float, float, float]:
    """(hit rate, the largest window share seen after the tier first filled, the largest in the
    second half); the window stays within [1 byte, the budget] after every request."""
    hits, largest, late = 0, 0.0, 0.0
    for index, key in enumerate(keys):
        if tier.get(key, 0.0) is not None:
            hits += 1
        else:
            tier.put(key, "v", 64, 1e18)
        assert 1 <= tier.window_max <= tier.max_bytes
        if tier._steering is not None:
            share = tier.window_max / tier.max_bytes
            largest = max(largest, share)
            if index >= len(keys) // 2:
                late = max(late, share)
    return hits / len(keys), largest, late


def lru_rate(keys: list[bytes]) -> float:
    held: dict[bytes, None] = {}
    hits = 0
    for key in keys:
        if key in held:
            hits += 1
            del held[key]
        elif len(held) >= ENTRIES:
            del held[next(iter(held))]
        held[key] = None
    return hits / len(keys)


@pytest.mark.parametrize("rising", [True, False])
def test_a_drifting_hit_rate_does_not_walk_the_window_away(rising: bool) -> None:
    keys = drifting_frequency_stream(80_000, rising, seed=3)
    rate, largest, late = replay(MemoryTier(64 * ENTRIES), keys)
    # It may try larger windows while the tier is still cold (about 20 % here, once), but it
    # never runs toward LRU, and it is back at its floor for the whole second half.
    assert largest <= 0.25, largest
    assert late <= 0.02, late
    fixed, _, _ = replay(MemoryTier(64 * ENTRIES, adaptive=False), keys)
    lru = lru_rate(keys)
    # The control: frequency pays on this stream, by far, and the adaptive tier keeps it.
    assert fixed > lru + 0.05, (fixed, lru)
    assert rate >= fixed - 0.005, (rate, fixed)
