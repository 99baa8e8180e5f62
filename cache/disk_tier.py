"""L3: local disk through diskcache (SQLite index + files), bounded in bytes, surviving
restarts, safe with several processes.

diskcache was chosen over LMDB for its built-in size bound with least-recently-stored eviction,
per-entry expiry and tags (an entry is tagged with its content digest, so erasure by content
is one call); an LMDB store would need all three written by hand. A disk that fails (full,
corrupted, removed) is bypassed after the first error: the tier reports itself down, the
cache goes on with the other tiers, and nothing reaches the request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["DiskTier"]

logger = logging.getLogger(__name__)
RETRY_AFTER_S = 30.0


class DiskTier:
    """Bytes by key text on local disk."""

    name = "disk"

    def __init__(
        self, directory: Path, max_bytes: int, on_error: Callable[[], None] = lambda: None
    ) -> None:
        import diskcache

        self.directory = directory
        self._down_until = 0.0
        self._on_error = on_error
        self.errors = 0
        self._cache: Any = None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._cache = diskcache.Cache(
                str(directory), size_limit=max_bytes, eviction_policy="least-recently-stored"
            )
        except Exception as err:  # unwritable, full or corrupt: start without this tier
            self._failed(err)
            self._down_until = float("inf")

    @property
    def up(self) -> bool:
        """False for a while after a failure."""
        return time.monotonic() >= self._down_until

    def _failed(self, err: Exception) -> None:
        self.errors += 1
        self._on_error()
        if self.up:
            logger.warning(
                "disk cache at %s bypassed for %.0f s: %s", self.directory, RETRY_AFTER_S, err
            )
        self._down_until = time.monotonic() + RETRY_AFTER_S

    def get(self, key: str) -> bytes | None:
        """The stored bytes, or None."""
        if not self.up:
            return None
        try:
            value = self._cache.get(key)
        except Exception as err:  # sqlite3.DatabaseError, OSError: a broken disk is a miss
            self._failed(err)
            return None
        return value if isinstance(value, bytes) else None

    def put(self, key: str, blob: bytes, ttl_s: float, tag: str) -> None:
        """Store with an expiry; failures bypass the tier."""
        if not self.up:
            return
        try:
            self._cache.set(key, blob, expire=ttl_s, tag=tag)
        except Exception as err:
            self._failed(err)

    def delete(self, key: str) -> None:
        """Drop one entry (a corrupt one, say)."""
        try:
            self._cache.delete(key)
        except Exception as err:
            self._failed(err)

    def erase_content(self, content: str) -> int:
        """Drop every entry derived from ``content``; how many. Raises if the disk fails: an
        erasure must not be reported done when it was not."""
        if self._cache is None:
            return 0
        return int(self._cache.evict(content))

    def erase_prefix(self, prefix: str) -> int:
        """Drop every entry whose key starts with ``prefix`` (a partition); raises on failure."""
        if self._cache is None:
            return 0
        removed = 0
        for key in list(self._cache.iterkeys()):
            if isinstance(key, str) and key.startswith(prefix) and self._cache.delete(key):
                removed += 1
        return removed

    def keys(self) -> list[Any]:
        """Every key (to warm the Bloom filter at start-up)."""
        try:
            return list(self._cache.iterkeys())
        except Exception as err:
            self._failed(err)
            return []

    @property
    def size_bytes(self) -> int:
        """Bytes on disk."""
        try:
            return int(self._cache.volume())
        except Exception:
            return 0

    def close(self) -> None:
        """Close the index."""
        if self._cache is not None:
            self._cache.close()
