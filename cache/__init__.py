"""The three-tier feature cache: memory, local disk and Redis behind a Bloom filter, with
single-flight and encryption for sensitive partitions."""

from hetero.cache.feature_cache import FeatureCache
from hetero.cache.keys import FeatureKey, content_digest, feature_key
from hetero.cache.metrics import CacheMetrics
from hetero.cache.stage_cache import StageOutputCache

__all__ = [
    "CacheMetrics",
    "FeatureCache",
    "FeatureKey",
    "StageOutputCache",
    "content_digest",
    "feature_key",
]
