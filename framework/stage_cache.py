"""The ``StageCache`` protocol: how the engine asks for, and offers, a stage's outputs by the
content of its inputs, without importing the cache (``hetero.cache.StageOutputCache``
implements it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

__all__ = ["StageCache"]

Arrays = Mapping[str, np.ndarray[Any, Any]]


class StageCache(Protocol):
    """Stage outputs by (stage, model version, variant, partition, input content)."""

    def get_outputs(
        self, stage: str, model_version: str, variant: str, partition: str | None, inputs: Arrays
    ) -> dict[str, np.ndarray[Any, Any]] | None:
        """The cached outputs, or None."""
        ...

    def put_outputs(
        self,
        stage: str,
        model_version: str,
        variant: str,
        partition: str | None,
        inputs: Arrays,
        outputs: Arrays,
    ) -> None:
        """Offer outputs for later requests with the same inputs."""
        ...
