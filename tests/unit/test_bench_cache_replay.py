"""`hetero bench cache`'s replay under other key hashings: the same requests, other key bits."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from hetero.framework.bench import cache_replay as bench


def stream(requests: int = 3000) -> list[bytes]:
    rng = random.Random(7)
    keys = [hashlib.blake2b(f"k{i}".encode(), digest_size=32).digest() for i in range(400)]
    return [keys[min(int(rng.paretovariate(1.1)), 400) - 1] for _ in range(requests)]


def lru_rate(requests: list[bytes], entries: int) -> float:
    return bench._replay(bench._Lru(entries * bench.REPLAY_VALUE_BYTES), requests)[0]


def test_rehashing_keeps_the_requests_and_changes_the_keys() -> None:
    original = stream()
    keyed = bench._rehashed(original, 1)
    assert len(keyed) == len(original)
    assert not set(keyed) & set(original)
    # One new name per key: the same request pattern, so LRU hits the same requests.
    assert len(set(zip(original, keyed, strict=True))) == len(set(original)) == len(set(keyed))
    assert lru_rate(keyed, 50) == lru_rate(original, 50)
    # Deterministic per salt, different between salts.
    assert bench._rehashed(original, 1) == keyed
    assert bench._rehashed(original, 2) != keyed


def test_other_hashings_count_the_misses_against_each_goal() -> None:
    requests = stream()
    unique = len(set(requests))
    figures: dict[str, Any] = {}
    for share in bench.SHARES:
        entries = max(1, int(share * unique))
        figures[f"{round(share * 100)}%"] = {"entries": entries, "lru": lru_rate(requests, entries)}
    report = bench._other_key_hashes("mooncake_synthetic", requests, figures)
    assert report["hashes"] == bench.OTHER_KEY_HASHES
    for name, row in figures.items():
        spread = report[name]
        assert spread["memory_tier_least"] <= spread["memory_tier_mean"]
        assert spread["memory_tier_mean"] <= spread["memory_tier_most"]
        assert 0 <= spread["below_goal"] <= bench.OTHER_KEY_HASHES
        # The control: a goal above every rate counts every hashing below it.
        impossible = {**row, "lru": 2.0}
        counted = bench._other_key_hashes(
            "mooncake_synthetic", requests, {**figures, name: impossible}
        )
        assert counted[name]["below_goal"] == bench.OTHER_KEY_HASHES


def test_a_replay_points_goal_is_lru_less_the_slack_or_a_fixed_window_that_beats_lru() -> None:
    skewed = bench._replay_row(stream(), 40)  # a skewed stream: frequency pays
    assert skewed["fixed_window"] > skewed["lru"]
    assert skewed["goal"] == skewed["fixed_window"]
    assert skewed["meets_goal"] == (skewed["memory_tier"] >= skewed["goal"])
    keys = [hashlib.blake2b(f"r{i}".encode(), digest_size=32).digest() for i in range(3000)]
    recency = [key for i in range(3000) for key in (keys[i], keys[max(0, i - 20)])]
    recent = bench._replay_row(recency, 100)  # each key asked twice, close together
    assert recent["fixed_window"] < recent["lru"]
    assert recent["goal"] == recent["lru"] - bench.LRU_SLACK_POINTS / 100
    assert recent["memory_tier_minus_lru_points"] == 100 * (recent["memory_tier"] - recent["lru"])
    assert 0 < recent["window_share_at_end"] <= 1
