"""The three-tier feature cache: memory, local disk and Redis behind a Bloom filter, with
single-flight and encryption for sensitive partitions.

The hot modules may run compiled (:mod:`hetero.cache.compiled`): a build that matches the sources
is searched before them, so it must be set up before any of them is imported.
"""

from hetero.cache.compiled import compiled_folder
from hetero.framework.envs import compiled_modules

_compiled = compiled_folder(__path__[0], enabled=compiled_modules())
if _compiled is not None:  # a new list: the package's spec keeps naming the sources alone
    __path__ = [_compiled, *__path__]

from hetero.cache.feature_cache import FeatureCache  # noqa: E402
from hetero.cache.keys import FeatureKey, content_digest, feature_key  # noqa: E402
from hetero.cache.metrics import CacheMetrics  # noqa: E402
from hetero.cache.stage_cache import StageOutputCache  # noqa: E402

__all__ = [
    "CacheMetrics",
    "FeatureCache",
    "FeatureKey",
    "StageOutputCache",
    "content_digest",
    "feature_key",
]
