"""``hetero bench cache``'s tier timings: the memory tier's own hit and miss-and-admit against an
``OrderedDict`` LRU, the L3 hit and the disk tier's reads against raw LMDB and raw diskcache
reads, and the L2 hit and ``get_many`` against raw redis-py ``GET`` and ``MGET``, all of the same
5 KB value."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from hetero.cache.codec import decode, decode_from, encode
from hetero.cache.feature_cache import FeatureCache
from hetero.cache.keys import feature_key
from hetero.cache.local_redis import RedisServer
from hetero.cache.memory_tier import MemoryTier
from hetero.framework.bench.cache_replay import _digest, _Lru
from hetero.framework.bench.cache_timing import READS, _timed_together
from hetero.framework.policy.schema import CacheConfig

VALUE = np.random.default_rng(0).standard_normal(1280).astype(np.float32)  # a 5 KB embedding


def _config(memory: bool, disk: bool, redis_url: str | None) -> CacheConfig:
    return CacheConfig.model_validate(
        {
            "memory": {"enabled": memory},
            "disk": {"enabled": disk},
            "redis": {
                "enabled": redis_url is not None,
                "url": redis_url or "redis://127.0.0.1:1/0",
            },
        }
    )


def _memory_costs() -> dict[str, Any]:
    """The memory tier's own hit and miss-and-admit, 5 KB values, full tier, against an
    ``OrderedDict`` LRU doing the same, each pair timed in alternation (so the machine's noise
    hits both alike)."""
    size = len(encode(VALUE))
    value = decode(encode(VALUE))
    entries = 2000
    keys = [_digest(f"cost-{i}") for i in range(entries)]
    tiers: dict[str, Any] = {"memory_tier": MemoryTier(entries * size), "lru": _Lru(entries * size)}
    hits: list[Callable[[], Any]] = []
    misses: list[Callable[[], Any]] = []
    for tier in tiers.values():
        for key in keys:
            tier.put(key, value, size, 1e18)
        for key in keys[: entries // 2]:
            tier.get(key, 0.0)
        hot = itertools.cycle(keys[:100])

        def hit(t: Any = tier, h: Iterator[bytes] = hot) -> None:
            t.get(next(h), 1.0)

        fresh: Iterator[bytes] = iter([os.urandom(32) for _ in range(20_000 + 200)])

        def miss_and_admit(t: Any = tier, f: Iterator[bytes] = fresh) -> None:
            digest = next(f)
            if t.get(digest, 1.0) is None:
                t.put(digest, value, size, 1e18)

        hits.append(hit)
        misses.append(miss_and_admit)
    results: dict[str, Any] = {}
    for name, figures in zip(tiers, _timed_together(*hits, reads=20_000), strict=True):
        results[f"{name}_hit"] = figures
    for name, figures in zip(tiers, _timed_together(*misses, reads=20_000), strict=True):
        results[f"{name}_miss_and_admit"] = figures
    return results


def _raw_lmdb(directory: Path, key: bytes, blob: bytes) -> Callable[[], bytes | None]:
    """A page-cached LMDB read of the same bytes under the same key, in a store of its own (the
    raw read of the store the disk tier uses)."""
    import lmdb

    env = lmdb.open(str(directory), map_size=64 * 2**20)
    with env.begin(write=True) as txn:
        txn.put(key, blob)

    def read() -> bytes | None:
        with env.begin(buffers=False) as txn:
            value: bytes | None = txn.get(key)
            return value

    return read


def _raw_diskcache(directory: Path, key: str, blob: bytes) -> Callable[[], Any] | None:
    """A raw diskcache read of the same bytes (the store the disk tier replaced), where
    diskcache is installed (the dev extra)."""
    try:
        import diskcache
    except ImportError:
        return None
    store = diskcache.Cache(str(directory))
    store.set(key, blob)
    return lambda: store.get(key)


def _disk_figures(root: Path, key: Any) -> dict[str, Any]:
    """An L3 hit through FeatureCache and the disk tier's own read, against raw LMDB and raw
    diskcache reads of the same 5 KB value, all four in alternation."""
    disk = FeatureCache(_config(False, True, None), directory=root / "d")
    try:
        disk.put(key, VALUE)
        tier = disk.disk
        assert tier is not None
        text = key.text  # built once by FeatureCache.get too: not the tier's cost
        blob = tier.get(text)
        assert blob is not None
        raw_lmdb = _raw_lmdb(root / "lmdb", key.text.encode(), blob)

        def raw_lmdb_and_decode() -> Any:
            read = raw_lmdb()
            assert read is not None
            return decode(read, "disk")

        def get_and_decode() -> Any:  # the L3 hit's read before 6 December, fifth session
            read = tier.get(text)
            assert read is not None
            return decode(read, "disk")

        def read_and_decode() -> Any:  # the L3 hit's read now: the record decoded in place
            stored = tier.read(text)
            assert stored is not None
            return decode_from(stored[0], stored[1], "disk")

        # The raw read gives bytes; an L3 hit gives the array: the raw read plus the same decode
        # (checksum, array over the bytes) is the reference for what FeatureCache itself adds.
        # l3_lookup: the same hit through FeatureCache.lookup, the read the engine and the
        # server make (get is lookup's value alone, one call more). The disk tier's two reads
        # with their decodes: the value sliced out of a buffer into the map (get) against the
        # record copied whole and decoded where the value lies (read), the one-copy read.
        names = [
            "l3_hit",
            "l3_lookup",
            "disk_tier_get",
            "disk_tier_get_and_decode",
            "disk_tier_read_and_decode",
            "raw_lmdb_get",
            "raw_lmdb_get_and_decode",
        ]
        actions: list[Callable[[], Any]] = [
            lambda: disk.get(key),
            lambda: disk.lookup(key),
            lambda: tier.get(text),
            get_and_decode,
            read_and_decode,
            raw_lmdb,
            raw_lmdb_and_decode,
        ]
        raw_diskcache = _raw_diskcache(root / "raw", key.text, blob)
        if raw_diskcache is not None:
            names.append("raw_diskcache_get")
            actions.append(raw_diskcache)
        results: dict[str, Any] = dict(zip(names, _timed_together(*actions), strict=True))
        # Every lookup here hits, so the cache stops asking its Bloom filter first (it weighs
        # that on its reads): the L3 hit is measured without the check; a cache whose lookups
        # below memory mostly miss keeps it first and pays it on each hit.
        results["l3_bloom_first"] = disk.bloom_first
        if raw_diskcache is None:
            results["raw_diskcache_get"] = "not measured: diskcache is not installed"
        return results
    finally:
        disk.close()


def _redis_figures(root: Path, key: Any) -> dict[str, Any]:
    """An L2 hit against a raw redis-py GET, and eight keys read by ``get_many`` against a raw
    ``MGET`` of eight, each pair in alternation."""
    import redis

    try:
        server = RedisServer(root / "redis").start()
    except (RuntimeError, OSError) as err:
        return {"redis": f"not measured: {err}"}
    try:
        remote = FeatureCache(_config(False, False, server.url), directory=root / "r")
        keys = [
            feature_key(f"many-{i}".encode(), stage="vision", model_version="1") for i in range(8)
        ]
        for each in (key, *keys):
            remote.put(each, VALUE)
        client = redis.Redis.from_url(server.url)
        stored = client.get(key.text)
        assert isinstance(stored, bytes)
        client.set("raw", stored)
        texts = [each.text for each in keys]
        results: dict[str, Any] = {}
        results["l2_hit"], results["raw_redis_get"] = _timed_together(
            lambda: remote.get(key), lambda: client.get("raw")
        )
        results["l2_get_many_8"], results["raw_redis_mget_8"] = _timed_together(
            lambda: remote.get_many(keys), lambda: client.mget(texts), reads=READS // 2
        )
        remote.close()
        return results
    finally:
        server.stop()
