"""What the feature cache's reads and writes share: its tiers and counters (declared here, set by
:class:`~hetero.cache.feature_cache.FeatureCache`), the lower tiers' order, a key's protection,
an entry's TTL with jitter and a write to one tier."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Protocol

from prometheus_client import Histogram

from hetero.cache.bloom import GenerationalBloom
from hetero.cache.disk_tier import DiskTier
from hetero.cache.keys import FeatureKey
from hetero.cache.memory_tier import MemoryTier
from hetero.cache.metrics import CacheMetrics
from hetero.cache.redis_tier import RedisTier
from hetero.cache.singleflight import SingleFlight
from hetero.framework.cipher import Cipher
from hetero.framework.errors import CacheError
from hetero.framework.policy.schema import CacheConfig

__all__ = ["FeatureTiers"]


class _Tier(Protocol):
    name: str

    @property
    def up(self) -> bool: ...

    def get(self, key: str) -> bytes | None: ...

    def read(self, key: str) -> tuple[bytes, int] | None: ...

    def get_many(self, keys: list[str]) -> list[bytes | None]: ...

    def delete(self, key: str) -> None: ...


class FeatureTiers:
    """A feature cache's fields, declared once so each part's file type-checks on its own
    (:class:`~hetero.cache.feature_cache.FeatureCache` sets every one), and the steps its reads
    and writes share."""

    config: CacheConfig
    sensitive: frozenset[str]
    _cipher_for: Callable[[str], Cipher | None]
    metrics: CacheMetrics
    memory: MemoryTier | None
    disk: DiskTier | None
    redis: RedisTier | None
    bloom: GenerationalBloom
    single_flight: SingleFlight
    _lower: list[_Tier]  # the lower tiers, fastest first (_order)
    _cost: dict[str, float]
    _miss_cost: dict[str, float]
    _bloom_cost: float
    _probe: FeatureKey  # the start-up probe's key, absent from every tier
    _reads: int
    _bloom_first: bool
    _below_seen: tuple[int, int]
    _rejected: int
    _read_misses: int
    _hits: dict[str, int]
    _latency: dict[str, Histogram]
    _plain: bool
    _enabled: bool
    bloom_warm: threading.Event
    _trust_bloom: bool
    _gate: bool

    # --- tier order ----------------------------------------------------------------------

    def _order(self) -> None:
        # A new list swapped in: readers iterating the old one never see it half-sorted. A tier
        # that is down answers instantly, so it ranks last rather than by that speed.
        self._lower = sorted(
            self._lower,
            key=lambda t: self._cost.get(t.name, float("inf")) if t.up else float("inf"),
        )

    @property
    def bloom_first(self) -> bool:
        """Whether lookups ask the Bloom filter before the lower tiers now (see
        :meth:`_weigh_bloom`); False also while the filter is still warming."""
        return self._gate

    def tier_order(self) -> list[str]:
        """The tiers in the order reads ask them."""
        return (["memory"] if self.memory is not None else []) + [t.name for t in self._lower]

    # --- sensitive entries ---------------------------------------------------------------

    def _protection(self, key: FeatureKey) -> tuple[bool, Cipher | None]:
        """(cacheable, cipher) for the key's partition."""
        if self._plain or key.partition is None or key.partition not in self.sensitive:
            return True, None
        if self.config.sensitive == "skip":
            return False, None
        cipher = self._cipher_for(key.partition)
        if cipher is None:
            raise CacheError(
                f"partition {key.partition!r} is sensitive and the policy says encrypt, "
                "but no cipher is available for it"
            )
        return True, cipher

    # --- writes ----------------------------------------------------------------------------

    def _ttl(self) -> float:
        return self.config.ttl_s * (1 + random.uniform(0, self.config.ttl_jitter))

    def _write(self, tier: _Tier, key: FeatureKey, blob: bytes, ttl_s: float) -> None:
        if isinstance(tier, DiskTier):
            tier.put(key.text, blob, ttl_s, key.content)
        elif isinstance(tier, RedisTier):
            if key.stage == "probe":  # the start-up probe needs no erasure index
                tier.guarded(lambda: tier.raw().set(key.text, blob, px=int(ttl_s * 1000)), None)
            else:
                tier.put(key.text, blob, ttl_s, key.content, key.partition)
