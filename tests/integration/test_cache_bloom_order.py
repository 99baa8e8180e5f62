"""Where the feature cache asks its Bloom filter: before the lower tiers only while the misses
there make it pay (a real disk tier; the probe's measured costs are fixed here, so the decision
does not depend on this machine's timing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cache_worker import cache_config, make_key

from hetero.cache import FeatureCache

# A disk miss three times a Bloom check: the filter pays once more than a third of the lookups
# below memory miss.
BLOOM_S = 1e-6
DISK_MISS_S = 3e-6


@pytest.fixture
def disk_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FeatureCache]:
    cache = FeatureCache(cache_config(None, memory={"enabled": False}), directory=tmp_path / "d")
    assert cache.bloom_warm.wait(30)
    monkeypatch.setattr(cache, "_bloom_cost", BLOOM_S)
    monkeypatch.setattr(cache, "_miss_cost", {"disk": DISK_MISS_S})
    yield cache
    cache.close()


class CountingBloom:
    """The cache's Bloom filter, its checks counted (the compiled filter's methods cannot be
    replaced on it)."""

    def __init__(self, inner: Any, calls: dict[str, int]) -> None:
        self._inner, self._calls = inner, calls

    def might_contain(self, digest: bytes) -> bool:
        self._calls["bloom"] += 1
        answer: bool = self._inner.might_contain(digest)
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def counting(cache: FeatureCache, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of Bloom checks and disk reads from here on."""
    calls = {"bloom": 0, "disk": 0}
    disk_get = cache.disk.get  # type: ignore[union-attr]

    def disk(text: str) -> bytes | None:
        calls["disk"] += 1
        return disk_get(text)

    monkeypatch.setattr(cache, "bloom", CountingBloom(cache.bloom, calls))
    monkeypatch.setattr(cache.disk, "get", disk)
    return calls


def test_hits_below_memory_stop_asking_the_bloom_filter_and_misses_bring_it_back(
    disk_only: FeatureCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert disk_only.bloom_first  # first until the lookups say otherwise
    stored = [make_key(f"stored-{i}".encode()) for i in range(8)]
    for index, each in enumerate(stored):
        disk_only.put(each, [index])
    calls = counting(disk_only, monkeypatch)
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
    assert not disk_only.bloom_first

    # Now only misses: each costs a disk read until a weighing puts the filter first again.
    calls.update(bloom=0, disk=0)
    for index in range(400):
        assert disk_only.get(make_key(f"never-{index}".encode())) is None
    assert calls["disk"] < 100  # the first weighing after at least 64 misses below
    assert calls["bloom"] > 300
    assert disk_only.metrics.bloom_negative_count > 300
    assert disk_only.bloom_first
