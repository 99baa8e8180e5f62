"""The Bloom filter in front of the tiers: "certainly absent" without a network or disk trip.

rbloom (a Rust Bloom filter) holds the bits; keys hash by their own BLAKE2b digest, so every
process and host agrees on positions. Entries expire, so the filter must forget: it keeps two
generations and rotates every ``ttl x (1 + jitter)`` seconds (add to the current one, ask
both). An entry is then remembered for at least one full lifetime and at most two, and no live
entry is ever reported absent. A counting filter would forget exactly but needs deletes
wired to expiry in every tier, which Redis and the disk library do silently; rotation needs
nothing from them.

Sharing: with Redis on, every write is published on a channel that every cache instance
subscribes to, so one worker's write is visible to the others at once; a new instance warms its
filter from the keys already in Redis and on disk.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from rbloom import Bloom

__all__ = ["GenerationalBloom"]

logger = logging.getLogger(__name__)
CHANNEL = "hetero:bloom"
_monotonic = time.monotonic
ERASE_CHANNEL = "hetero:erase"


def _hash(digest: bytes) -> int:
    """The key's own 128 bits as an int. rbloom hashes an int with Python's hash(), which is
    the same in every process for ints (unlike bytes), and calls no Python code to do it."""
    return int.from_bytes(digest[:16], "little")


class GenerationalBloom:
    """Two rbloom generations, rotated on a clock; optionally kept in sync through Redis."""

    def __init__(
        self, expected_entries: int, false_positive_rate: float, rotate_after_s: float
    ) -> None:
        self._expected = expected_entries
        self._rate = false_positive_rate
        self.rotate_after_s = rotate_after_s
        self._current = Bloom(expected_entries, false_positive_rate)
        self._previous = Bloom(expected_entries, false_positive_rate)
        self._rotated_at = time.monotonic()
        self._rotate_at = self._rotated_at + rotate_after_s
        self._lock = threading.Lock()
        self._subscriber: Any = None  # redis-py's PubSubWorkerThread
        self._pubsub: Any = None
        self._client: Any = None
        self._on_erase: Callable[[str], None] | None = None

    def _rotate(self) -> None:
        with self._lock:
            if time.monotonic() >= self._rotate_at:
                self._previous = self._current
                self._current = Bloom(self._expected, self._rate)
                self._rotated_at = time.monotonic()
                self._rotate_at = self._rotated_at + self.rotate_after_s

    def might_contain(self, digest: bytes) -> bool:
        """False means certainly absent."""
        if _monotonic() >= self._rotate_at:  # rarely true
            self._rotate()
        key = int.from_bytes(digest[:16], "little")  # _hash, inlined: this is the miss path
        return key in self._current or key in self._previous

    def add(self, digest: bytes, *, publish: bool = True) -> None:
        """Remember ``digest`` (and tell the other instances)."""
        if _monotonic() >= self._rotate_at:
            self._rotate()
        self._current.add(_hash(digest))
        if publish and self._client is not None:
            try:
                self._client.publish(CHANNEL, digest)
            except Exception as err:  # Redis down: this instance still knows
                logger.debug("bloom publish failed: %s", err)

    def add_many(self, digests: Iterable[bytes]) -> int:
        """Warm from existing keys; how many."""
        count = 0
        for digest in digests:
            self._current.add(_hash(digest))
            count += 1
        return count

    def share_through(self, client: Any, on_erase: Callable[[str], None] | None = None) -> None:
        """Subscribe to other instances' writes (and erasures) on ``client``'s Redis and
        publish ours."""
        self._client = client
        self._on_erase = on_erase
        try:
            self._pubsub = client.pubsub(ignore_subscribe_messages=True)
            self._pubsub.subscribe(
                **{CHANNEL: self._on_message, ERASE_CHANNEL: self._on_erase_message}
            )
            self._subscriber = self._pubsub.run_in_thread(
                sleep_time=0.5, daemon=True, exception_handler=self._on_error
            )
        except Exception as err:
            logger.warning("bloom filter not shared (Redis unavailable): %s", err)
            self._pubsub = None

    def _on_message(self, message: dict[str, Any]) -> None:
        data = message.get("data")
        if isinstance(data, bytes) and len(data) >= 16:
            self.add(data, publish=False)

    def announce_erase(self, what: str) -> None:
        """Tell every instance to erase ``c:<content>`` or ``p:<partition>`` locally."""
        if self._client is not None:
            self._client.publish(ERASE_CHANNEL, what)

    def _on_erase_message(self, message: dict[str, Any]) -> None:
        data = message.get("data")
        if isinstance(data, bytes) and self._on_erase is not None:
            self._on_erase(data.decode(errors="replace"))

    def _on_error(self, err: BaseException, pubsub: Any, thread: Any) -> None:
        logger.debug("bloom subscriber: %s", err)

    def close(self) -> None:
        """Stop the subscriber."""
        if self._subscriber is not None:
            self._subscriber.stop()
            self._subscriber = None
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                self._pubsub.close()
            self._pubsub = None
