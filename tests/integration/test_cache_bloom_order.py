"""Where the feature cache asks its Bloom filter: before the lower tiers only while the misses
there make it pay (a real disk tier; the costs the cache times are set here by a clock that a
disk miss and a Bloom check advance by fixed amounts, so the decision does not depend on this
machine's timing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cache_worker import cache_config, make_key

from hetero.cache import FeatureCache, feature_reads

# A disk miss three times a Bloom check: the filter pays once more than a third of the lookups
# below memory miss.
BLOOM_S = 1e-6
DISK_MISS_S = 3e-6


def asks_first(cache: FeatureCache) -> bool:
    """Whether the cache asks its Bloom filter first now (a call: mypy would take two reads of
    the property in one test for the same value)."""
    return cache.bloom_first


class Costs:
    """The clock the cache times its reads and Bloom checks on: it stands still except that a
    disk read that misses advances it by ``disk_miss`` (a hit by a tenth of a microsecond), and
    a Bloom check by ``bloom``."""

    def __init__(self) -> None:
        self.now = 0.0
        self.bloom = BLOOM_S
        self.disk_miss = DISK_MISS_S

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def costs(monkeypatch: pytest.MonkeyPatch) -> Costs:
    clock = Costs()
    monkeypatch.setattr(feature_reads, "_perf", clock)  # the clock of the timed reads
    return clock


@pytest.fixture
def disk_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, costs: Costs
) -> Iterator[FeatureCache]:
    cache = FeatureCache(cache_config(None, memory={"enabled": False}), directory=tmp_path / "d")
    assert cache.bloom_warm.wait(30)
    # The start-up probe's figures (timed on the real clock before the fixture's was in use).
    monkeypatch.setattr(cache, "_bloom_cost", BLOOM_S)
    monkeypatch.setattr(cache, "_miss_cost", {"disk": DISK_MISS_S})
    yield cache
    cache.close()


class CountingBloom:
    """The cache's Bloom filter, its checks counted and costed on the fixture's clock (the
    compiled filter's methods cannot be replaced on it)."""

    def __init__(self, inner: Any, calls: dict[str, int], clock: Costs) -> None:
        self._inner, self._calls, self._clock = inner, calls, clock

    def might_contain(self, digest: bytes) -> bool:
        self._calls["bloom"] += 1
        self._clock.now += self._clock.bloom
        answer: bool = self._inner.might_contain(digest)
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def counting(cache: FeatureCache, monkeypatch: pytest.MonkeyPatch, clock: Costs) -> dict[str, int]:
    """Counts of Bloom checks and of the lookups' disk reads from here on, each costed on
    ``clock``."""
    calls = {"bloom": 0, "disk": 0}
    disk_get = cache.disk.get  # type: ignore[union-attr]
    disk_read = cache.disk.read  # type: ignore[union-attr]

    probe = cache._probe.text  # the weighings' own timed read of an absent key

    def disk(text: str) -> bytes | None:
        calls["disk"] += text != probe
        blob = disk_get(text)
        clock.now += clock.disk_miss if blob is None else 1e-7
        return blob

    def disk_record(text: str) -> tuple[bytes, int] | None:  # the lookups' one-copy read
        calls["disk"] += text != probe
        stored = disk_read(text)
        clock.now += clock.disk_miss if stored is None else 1e-7
        return stored

    monkeypatch.setattr(cache, "bloom", CountingBloom(cache.bloom, calls, clock))
    monkeypatch.setattr(cache.disk, "get", disk)
    monkeypatch.setattr(cache.disk, "read", disk_record)
    return calls


def test_hits_below_memory_stop_asking_the_bloom_filter_and_misses_bring_it_back(
    disk_only: FeatureCache, monkeypatch: pytest.MonkeyPatch, costs: Costs
) -> None:
    assert asks_first(disk_only)  # first until the lookups say otherwise
    stored = [make_key(f"stored-{i}".encode()) for i in range(8)]
    for index, each in enumerate(stored):
        disk_only.put(each, [index])
    calls = counting(disk_only, monkeypatch, costs)
    for _ in range(40):  # 320 lookups, every one a disk hit
        for index, each in enumerate(stored):
            assert disk_only.get(each) == [index]
    # Asked first (the start), until the first weighing found no miss below: then never.
    first = calls["bloom"]
    assert 0 < first < 320
    for index, each in enumerate(stored):
        assert disk_only.get(each) == [index]
    assert calls["bloom"] == first
    assert calls["disk"] == 328  # the control: every lookup read the disk
    assert not asks_first(disk_only)

    # Now only misses: each costs a disk read until a weighing puts the filter first again.
    calls.update(bloom=0, disk=0)
    for index in range(400):
        assert disk_only.get(make_key(f"never-{index}".encode())) is None
    assert calls["disk"] < 100  # the first weighing after at least 64 misses below
    assert calls["bloom"] > 300
    assert disk_only.metrics.bloom_negative_count > 300
    assert asks_first(disk_only)


def half_misses(cache: FeatureCache, stored: list[Any], rounds: int, tag: str) -> None:
    """``rounds`` lookups of each stored key, each followed by a lookup of a key never stored:
    half the lookups below memory miss."""
    for round_ in range(rounds):
        for index, each in enumerate(stored):
            assert cache.get(each) == [index]
            assert cache.get(make_key(f"{tag}-{round_}-{index}".encode())) is None


def test_the_weighing_follows_the_costs_as_they_are_now_not_the_start_up_probes(
    disk_only: FeatureCache, monkeypatch: pytest.MonkeyPatch, costs: Costs
) -> None:
    stored = [make_key(f"kept-{i}".encode()) for i in range(8)]
    for index, each in enumerate(stored):
        disk_only.put(each, [index])
    calls = counting(disk_only, monkeypatch, costs)
    # Half the lookups miss and a disk miss costs three checks: the filter pays (0.5 x 3 > 1).
    half_misses(disk_only, stored, 50, "a")
    assert asks_first(disk_only)
    assert disk_only.metrics.bloom_negative_count > 300  # the control: it was asked first
    # The disk's misses get cheap (a small store, a page cache warmed): a miss now costs 1.5
    # checks, 0.5 x 1.5 < 1. The probe's 3 us would keep the filter first; the sampled misses'
    # timings take it out.
    costs.disk_miss = 1.5 * BLOOM_S
    before = calls["bloom"]
    half_misses(disk_only, stored, 400, "b")
    assert not asks_first(disk_only)
    asked = calls["bloom"] - before
    half_misses(disk_only, stored, 20, "c")
    assert calls["bloom"] - before - asked <= 320 // 64  # the weighings' own timed checks only
    # The check gets slow instead (its bits pushed out of the CPU's caches): back to misses that
    # cost three checks, and a check that costs two: still 0.5 x 3 < 2, the filter stays out.
    costs.disk_miss, costs.bloom = DISK_MISS_S, 2 * BLOOM_S
    half_misses(disk_only, stored, 400, "d")
    assert not asks_first(disk_only)
    # And cheap again: it comes back first.
    costs.bloom = BLOOM_S
    half_misses(disk_only, stored, 400, "e")
    assert asks_first(disk_only)
