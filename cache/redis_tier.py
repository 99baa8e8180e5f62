"""L2: Redis, shared by workers and hosts (redis-py, pooled connections, binary values).

Every call has the policy's timeout. A Redis that is down or slow makes the tier report a miss,
log once, count the failure and stay out of the way for a few seconds before it is tried again;
no request fails because of it. Entries carry a TTL (with the cache's jitter); each write also
adds the key to a per-content and a per-partition index set, so erasure finds every entry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["RedisTier"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_AFTER_S = 2.0
INDEX = "hetero:idx"
ERASE = """
local keys = redis.call('smembers', KEYS[1])
for _, key in ipairs(keys) do redis.call('del', key) end
redis.call('del', KEYS[1])
return #keys
"""


class RedisTier:
    """Bytes by key text in Redis."""

    name = "redis"

    def __init__(
        self, url: str, timeout_s: float, on_error: Callable[[], None] = lambda: None
    ) -> None:
        import redis

        self._redis_module = redis
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=30,
        )
        self._down_until = 0.0
        self._logged = False
        self._on_error = on_error
        self.errors = 0
        self._erase_script = self.client.register_script(ERASE)

    @property
    def up(self) -> bool:
        """False for a while after a failure."""
        return time.monotonic() >= self._down_until

    def _call(self, action: Callable[[], T], default: T) -> T:
        if not self.up:
            return default
        try:
            result = action()
        except self._redis_module.RedisError as err:
            self.errors += 1
            self._on_error()
            self._down_until = time.monotonic() + RETRY_AFTER_S
            if not self._logged:
                logger.warning("redis cache tier unavailable, serving from the others: %s", err)
                self._logged = True
            return default
        if self._logged:
            logger.warning("redis cache tier is back")
            self._logged = False
        return result

    def get(self, key: str) -> bytes | None:
        """The stored bytes, or None."""
        value = self._call(lambda: self.client.get(key), None)
        return value if isinstance(value, bytes) else None

    def read(self, key: str) -> tuple[bytes, int] | None:
        """:meth:`get`'s bytes as (record, where the value starts): the value is the record."""
        value = self._call(lambda: self.client.get(key), None)
        return (value, 0) if isinstance(value, bytes) else None

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """The stored bytes of several keys, in order, in one round trip (``MGET``)."""
        values = self._call(lambda: self.client.mget(keys), None)
        if values is None:
            return [None] * len(keys)
        return [value if isinstance(value, bytes) else None for value in values]

    def put(self, key: str, blob: bytes, ttl_s: float, content: str, partition: str | None) -> None:
        """Store with an expiry and index the key for erasure, in one round trip. Index sets
        expire with their newest entry, so they never outlive what they index for long."""

        def write() -> None:
            ttl_ms = max(1, int(ttl_s * 1000))
            pipe = self.client.pipeline(transaction=False)
            pipe.set(key, blob, px=ttl_ms)
            for index in (f"{INDEX}:c:{content}", f"{INDEX}:p:{partition or '-'}"):
                pipe.sadd(index, key)
                pipe.pexpire(index, ttl_ms, gt=True)
                pipe.pexpire(index, ttl_ms, nx=True)
            pipe.execute()

        self._call(write, None)

    def delete(self, key: str) -> None:
        """Drop one entry."""
        self._call(lambda: self.client.delete(key), 0)

    def _erase_index(self, index: str) -> int:
        """Delete every key of an index set and the set, atomically (a write landing in between
        cannot lose its index entry). Erasure ignores the back-off: it must try now, and it
        raises if Redis cannot be reached, so the caller knows the erasure did not happen."""
        erased = self._erase_script(keys=[index])
        return int(erased)

    def erase_content(self, content: str) -> int:
        """Drop every entry derived from ``content``."""
        return self._erase_index(f"{INDEX}:c:{content}")

    def erase_partition(self, partition: str) -> int:
        """Drop every entry of ``partition``."""
        return self._erase_index(f"{INDEX}:p:{partition}")

    def scan_keys(self, pattern: str, limit: int) -> list[bytes]:
        """Up to ``limit`` keys matching ``pattern`` (to warm the Bloom filter)."""

        def scan() -> list[bytes]:
            found: list[bytes] = []
            for key in self.client.scan_iter(match=pattern, count=1000):
                found.append(key)
                if len(found) >= limit:
                    break
            return found

        return self._call(scan, [])

    def raw(self) -> Any:
        """The redis-py client, for the Bloom filter's pub/sub and single-flight locks."""
        return self.client

    def guarded(self, action: Callable[[], T], default: T) -> T:
        """Run ``action`` on the client through this tier's back-off (for locks, publishes)."""
        return self._call(action, default)
