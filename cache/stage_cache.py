"""The engine's view of the feature cache: stage outputs keyed by the content of the inputs."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from hetero.cache.feature_cache import FeatureCache
from hetero.cache.keys import DIGEST_BYTES, FeatureKey, feature_key

__all__ = ["StageOutputCache", "inputs_digest"]

Arrays = Mapping[str, np.ndarray[Any, Any]]


def inputs_digest(inputs: Arrays) -> str:
    """BLAKE2b-256 over every input's name, dtype, shape and bytes, in name order."""
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for name in sorted(inputs):
        array = np.ascontiguousarray(inputs[name])
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class StageOutputCache:
    """Implements :class:`hetero.framework.stage_cache.StageCache` on a :class:`FeatureCache`."""

    def __init__(self, cache: FeatureCache) -> None:
        self.cache = cache

    @staticmethod
    def _key(
        stage: str, model_version: str, variant: str, partition: str | None, inputs: Arrays
    ) -> FeatureKey:
        return feature_key(
            inputs_digest(inputs),
            stage=stage,
            model_version=model_version,
            params={"variant": variant},
            partition=partition,
        )

    def get_outputs(
        self, stage: str, model_version: str, variant: str, partition: str | None, inputs: Arrays
    ) -> dict[str, np.ndarray[Any, Any]] | None:
        """The cached outputs, or None."""
        value = self.cache.get(self._key(stage, model_version, variant, partition, inputs))
        return value if isinstance(value, dict) else None

    def put_outputs(
        self,
        stage: str,
        model_version: str,
        variant: str,
        partition: str | None,
        inputs: Arrays,
        outputs: Arrays,
    ) -> None:
        """Offer outputs (a mapping of arrays) for later requests with the same inputs."""
        key = self._key(stage, model_version, variant, partition, inputs)
        self.cache.put(key, {name: np.asarray(value) for name, value in outputs.items()})
