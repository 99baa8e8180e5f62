"""The cost figures a policy variant gives, as the :class:`BandwidthHint` the scheduler and
``hetero plan`` price work with."""

from __future__ import annotations

from hetero.framework.graph import BandwidthHint
from hetero.framework.policy.schema import VariantConfig

__all__ = ["hint_from_variant"]


def hint_from_variant(variant: VariantConfig) -> BandwidthHint | None:
    """The BandwidthHint a policy variant describes; None when it gives no cost figures (a
    stage plugin's graphs give them)."""
    if variant.flops_per_item is None or variant.bytes_per_item is None:
        return None
    return BandwidthHint(
        flops_per_item=variant.flops_per_item,
        bytes_per_item=variant.bytes_per_item,
        input_bytes=variant.input_bytes,
        output_bytes=variant.output_bytes,
        resident_bytes=variant.resident_bytes,
        batchable=variant.batchable,
        max_batch=variant.max_batch,
        dtype=variant.dtype,
        kv_bytes_per_token=variant.kv_bytes_per_token,
    )
