"""``hetero bench cache``: each tier's hit, and a Bloom-rejected miss, side by side with raw
redis-py, raw LMDB and raw diskcache reads of the same 5 KB value (and eight keys read together
against a raw ``MGET``); the memory tier's own cost per
hit and per miss-and-admit against an ``OrderedDict`` LRU; and a trace replay: the memory tier's
hit rate (adaptive window, and fixed at 1 %) against LRU, the TinyLFU it replaced and the
unbounded ceiling at 1/5/10/25 % of the unique keys, on the two reuse streams (the Mooncake
synthetic trace, the only keyed reuse trace in shared/data/traces/, and a Zipf stream with
one-off scans made here), and the get-or-put cost of the whole replay against an ``OrderedDict``
LRU class in the same run. Needs ``redis-server`` on PATH for the Redis figures (it starts its
own on a free port)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from hetero.cache.compiled import running_compiled
from hetero.cache.feature_cache import FeatureCache
from hetero.cache.keys import feature_key
from hetero.framework.bench.cache_replay import LRU_SLACK_POINTS, _trace_replay
from hetero.framework.bench.cache_tiers import (
    VALUE,
    _config,
    _disk_figures,
    _memory_costs,
    _redis_figures,
)
from hetero.framework.bench.cache_timing import READS, _timed

__all__ = ["run_cache_bench"]


def _ratios(results: dict[str, Any]) -> None:
    """Each tier against the raw read of its store."""
    p50 = {
        name: f["p50_us"] for name, f in results.items() if isinstance(f, dict) and "p50_us" in f
    }
    pairs = {
        "l3_over_raw_lmdb_p50": ("l3_hit", "raw_lmdb_get"),
        "l3_over_raw_lmdb_and_decode_p50": ("l3_hit", "raw_lmdb_get_and_decode"),
        "l3_lookup_over_raw_lmdb_and_decode_p50": ("l3_lookup", "raw_lmdb_get_and_decode"),
        "disk_tier_over_raw_lmdb_p50": ("disk_tier_get", "raw_lmdb_get"),
        "disk_tier_read_over_get_with_decode_p50": (
            "disk_tier_read_and_decode",
            "disk_tier_get_and_decode",
        ),
        "raw_lmdb_over_raw_diskcache_p50": ("raw_lmdb_get", "raw_diskcache_get"),
        "l2_over_raw_redis_p50": ("l2_hit", "raw_redis_get"),
        "l2_get_many_8_over_raw_mget_8_p50": ("l2_get_many_8", "raw_redis_mget_8"),
    }
    results["ratios"] = {
        name: p50[top] / p50[bottom]
        for name, (top, bottom) in pairs.items()
        if top in p50 and bottom in p50
    }


def run_cache_bench() -> dict[str, Any]:
    """Every figure, measured in one run."""
    results: dict[str, Any] = {
        "value_bytes": int(VALUE.nbytes),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "compiled_modules": running_compiled(),  # hetero.cache's modules run from their build
    }
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

        results.update(_disk_figures(root, key))
        results.update(_redis_figures(root, key))
    _ratios(results)
    results["memory_tier_cost"] = _memory_costs()
    replay = _trace_replay()
    results["trace_replay"] = replay
    zipf_1pct = replay["zipf_with_scans"]["1%"]
    results["l1_hit_rate"] = {  # the summary line of the table view: W-TinyLFU against LRU
        "tinylfu": zipf_1pct["memory_tier"],
        "lru": zipf_1pct["lru"],
        "stream": "zipf_with_scans at 1 % of its unique keys",
    }
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["goals"] = {
        "memory_tier_hit_p50_us": 1.5,
        "memory_tier_miss_and_admit_p50_us": 2,
        "replay_memory_tier_minus_lru_points_at_least": -LRU_SLACK_POINTS,
        "replay_zipf_memory_tier_minus_tinylfu_before_points_at_least": 0,
        "l3_over_raw_lmdb_and_decode": 1.5,
        "replay_memory_tier_over_lru_cost": 3,
        "l2_over_raw": 1.2,
        "bloom_rejected_miss_p50_us": 2,
    }
    return results
