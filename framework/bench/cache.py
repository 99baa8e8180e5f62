"""``hetero bench cache``: each tier's hit, and a Bloom-rejected miss, side by side with raw
redis-py and raw diskcache reads of the same 5 KB value, plus the L1 policy's hit rate against
plain LRU on a skewed stream with one-off scans. Needs ``redis-server`` on PATH for the Redis
figures (it starts its own on a free port)."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hetero.cache.feature_cache import FeatureCache
from hetero.cache.keys import feature_key
from hetero.cache.local_redis import RedisServer
from hetero.cache.memory_tier import MemoryTier
from hetero.framework.policy.schema import CacheConfig

__all__ = ["run_cache_bench"]

READS = 5000
VALUE = np.random.default_rng(0).standard_normal(1280).astype(np.float32)  # a 5 KB embedding


def _timed(action: Callable[[], Any], reads: int = READS) -> dict[str, float]:
    for _ in range(200):
        action()
    samples = []
    for _ in range(reads):
        started = time.perf_counter_ns()
        action()
        samples.append(time.perf_counter_ns() - started)
    samples.sort()
    return {
        "p50_us": statistics.median(samples) / 1000,
        "p99_us": samples[int(0.99 * len(samples))] / 1000,
    }


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


def _hit_rates(capacity: int = 200, requests: int = 200_000) -> dict[str, float]:
    """Zipf(1.1) over 10,000 items, with a scan of 500 one-off items every 5,000 requests."""
    rng = np.random.default_rng(1)
    popular = rng.zipf(1.1, requests) % 10_000
    tiers = {
        "tinylfu": MemoryTier(capacity, expected_entries=capacity),
        "lru": MemoryTier(capacity, expected_entries=capacity, admission=False),
    }
    hits = dict.fromkeys(tiers, 0)
    keys = [
        feature_key(str(i).encode(), stage="s", model_version="1").digest for i in range(10_000)
    ]
    scan_id = 0
    for index, item in enumerate(popular):
        stream = [keys[int(item)]]
        if index % 5000 == 0:
            stream += [
                feature_key(f"scan-{scan_id}-{j}".encode(), stage="s", model_version="1").digest
                for j in range(500)
            ]
            scan_id += 1
        for digest in stream:
            for name, tier in tiers.items():
                if tier.get(digest, 0.0) is not None:
                    hits[name] += 1
                else:
                    tier.put(digest, 1, 1, 1e18)  # a miss computes and offers its value
    total = requests + scan_id * 500
    return {name: count / total for name, count in hits.items()}


def run_cache_bench() -> dict[str, Any]:
    """Every figure, measured in one run."""
    import diskcache
    import redis

    results: dict[str, Any] = {"value_bytes": int(VALUE.nbytes)}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        key = feature_key(b"bench-content", stage="vision", model_version="1")
        memory = FeatureCache(_config(True, False, None), directory=root / "m")
        memory.put(key, VALUE)
        results["l1_hit"] = _timed(lambda: memory.get(key))
        missing = [
            feature_key(f"never-{i}".encode(), stage="vision", model_version="1")
            for i in range(READS + 200)
        ]
        probe = iter(missing)
        results["bloom_rejected_miss"] = _timed(lambda: memory.get(next(probe)))
        memory.close()

        disk = FeatureCache(_config(False, True, None), directory=root / "d")
        disk.put(key, VALUE)
        results["l3_hit"] = _timed(lambda: disk.get(key))
        raw_disk = diskcache.Cache(str(root / "raw"))
        raw_disk.set("k", disk.disk._cache.get(key.text))  # type: ignore[union-attr]
        results["raw_diskcache_get"] = _timed(lambda: raw_disk.get("k"))
        raw_disk.close()
        disk.close()

        try:
            server = RedisServer(root / "redis").start()
        except (RuntimeError, OSError) as err:
            results["redis"] = f"not measured: {err}"
        else:
            try:
                remote = FeatureCache(_config(False, False, server.url), directory=root / "r")
                remote.put(key, VALUE)
                results["l2_hit"] = _timed(lambda: remote.get(key))
                client = redis.Redis.from_url(server.url)
                stored = client.get(key.text)
                assert isinstance(stored, bytes)
                client.set("raw", stored)
                results["raw_redis_get"] = _timed(lambda: client.get("raw"))
                remote.close()
            finally:
                server.stop()
    results["ratios"] = {
        "l3_over_raw_diskcache_p50": results["l3_hit"]["p50_us"]
        / results["raw_diskcache_get"]["p50_us"],
    }
    if "l2_hit" in results:
        results["ratios"]["l2_over_raw_redis_p50"] = (
            results["l2_hit"]["p50_us"] / results["raw_redis_get"]["p50_us"]
        )
    results["l1_hit_rate"] = _hit_rates()
    results["goals"] = {
        "l1_hit_p50_us": 5,
        "l3_over_raw": 1.5,
        "l2_over_raw": 1.2,
        "bloom_rejected_miss_p50_us": 2,
    }
    return results
