"""Helpers shared by the cache tests, importable by spawned worker processes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from hetero.cache import FeatureCache, FeatureKey, feature_key
from hetero.framework.policy.schema import CacheConfig


def cache_config(url: str | None, **changes: Any) -> CacheConfig:
    data: dict[str, Any] = {
        "memory": {"max_bytes": 16 * 2**20},
        "disk": {"max_bytes": 64 * 2**20},
        "redis": {
            "enabled": url is not None,
            "url": url or "redis://127.0.0.1:1/0",
            "timeout_ms": 200,
        },
        "bloom": {"expected_entries": 10_000, "false_positive_rate": 0.01},
        "ttl_s": 600,
    }
    data.update(changes)
    return CacheConfig.model_validate(data)


def make_key(content: bytes, stage: str = "vision", partition: str | None = None) -> FeatureKey:
    return feature_key(
        content, stage=stage, model_version="v1", params={"size": 224}, partition=partition
    )


def stampede_worker(url: str, directory: str, threads: int, ready: Any) -> None:
    """One process of the cross-process single-flight test: ``threads`` callers miss together."""
    import redis

    client = redis.Redis.from_url(url)
    instance = FeatureCache(cache_config(url), directory=Path(directory))
    key = make_key(b"cross-process")

    def compute() -> Any:
        client.incr("test:computations")
        deadline = time.monotonic() + 30
        # Hold the lock until every caller of both processes has started.
        while int(client.get("test:started") or 0) < 2 * threads and time.monotonic() < deadline:
            time.sleep(0.001)
        return [1, 2, 3]

    def call() -> None:
        client.incr("test:started")
        assert instance.get_or_compute(key, compute) == [1, 2, 3]

    workers = [threading.Thread(target=call) for _ in range(threads)]
    ready.wait()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    instance.close()
