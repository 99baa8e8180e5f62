"""Small shims over transformers: offline mode, quiet loading, the KV-cache argument's name."""

from __future__ import annotations

import inspect
from typing import Any

from hetero.models.assets import offline_hub

__all__ = ["cache_of", "quiet_transformers", "with_cache"]


def quiet_transformers() -> None:
    """Hub access off, weight-loading progress bars off (they write to stderr per load)."""
    offline_hub()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def with_cache(forward: Any, cache: Any) -> dict[str, Any]:
    """The keyword carrying the KV cache: ``cache`` in transformers 5.2x, else
    ``past_key_values`` (deprecated there with a warning)."""
    if "cache" in inspect.signature(forward).parameters:
        return {"cache": cache}
    return {"past_key_values": cache}


def cache_of(output: Any) -> Any:
    """The KV cache a forward pass returned, under either name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)
