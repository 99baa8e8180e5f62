"""Single-flight: concurrent misses on one key compute once.

In-process, the first caller leads and the others wait on its future. Across processes, the
leader also holds a Redis lock (``SET NX PX`` with a random token, released by a
compare-and-delete script, so a lock that expired and was taken by another process is never
released by the old holder); processes that do not get it poll the shared tiers until the value
appears, or until the lock is gone. A leader that fails leaves its error under a short-lived key:
every waiter, in-process or not, gets that error, and nothing is cached.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from hetero.framework.errors import CacheError

__all__ = ["LeaderFailedError", "SingleFlight"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
LOCK_PREFIX = "hetero:lock:"
ERROR_PREFIX = "hetero:err:"
ERROR_TTL_MS = 5_000
POLL_START_S = 0.002
POLL_MAX_S = 0.05
RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class LeaderFailedError(CacheError, RuntimeError):
    """The process that computed this key failed; its error, passed on to a waiter."""


class SingleFlight:
    """One computation per key at a time, in this process and (with Redis) across processes."""

    def __init__(
        self,
        client: Any = None,
        lock_ttl_s: float = 30.0,
        available: Callable[[], bool] | None = None,
    ) -> None:
        self._client = client
        self._available = available or (lambda: True)
        self._lock_ttl_ms = int(lock_ttl_s * 1000)
        self._inflight: dict[str, Future[Any]] = {}
        self._guard = threading.Lock()
        self._release = client.register_script(RELEASE) if client is not None else None
        self.waits = 0
        self.computations = 0

    def run(
        self,
        key: str,
        compute: Callable[[], T],
        lookup: Callable[[], T | None],
        store: Callable[[T], None],
        *,
        sensitive: bool = False,
    ) -> T:
        """``compute`` once for ``key`` and ``store`` the result; everyone else gets that.
        ``sensitive`` keeps the error message of a failed computation inside the process."""
        with self._guard:
            future = self._inflight.get(key)
            leader = future is None
            if leader:
                future = Future()
                self._inflight[key] = future
            else:
                self.waits += 1
        assert future is not None
        if not leader:
            return future.result()  # type: ignore[no-any-return]
        try:
            value = self._lead(key, compute, lookup, store, sensitive)
        except BaseException as err:
            future.set_exception(err)
            raise
        else:
            future.set_result(value)
            return value
        finally:
            with self._guard:
                del self._inflight[key]

    def _compute(self, compute: Callable[[], T], store: Callable[[T], None]) -> T:
        self.computations += 1
        value = compute()
        try:
            store(value)
        except Exception as err:  # a value that cannot be cached is still the answer
            logger.warning("computed value not cached: %s", err)
        return value

    def _lead(
        self,
        key: str,
        compute: Callable[[], T],
        lookup: Callable[[], T | None],
        store: Callable[[T], None],
        sensitive: bool,
    ) -> T:
        client = self._client
        if client is None or not self._available():  # Redis backing off: this process only
            return self._compute(compute, store)
        lock, token = LOCK_PREFIX + key, uuid.uuid4().hex
        while True:
            try:
                acquired = bool(client.set(lock, token, nx=True, px=self._lock_ttl_ms))
            except Exception as err:  # Redis down: coordinate within this process only
                logger.debug("single-flight lock unavailable: %s", err)
                return self._compute(compute, store)
            if acquired:
                try:
                    # Another process may have stored it between our miss and our lock.
                    found = lookup()
                    return found if found is not None else self._compute(compute, store)
                except BaseException as err:
                    self._leave_error(key, token, err, sensitive)
                    raise
                finally:
                    self._unlock(lock, token)
            value = self._wait_for_other(key, lock, lookup)
            if value is not None:
                return value

    def _wait_for_other(self, key: str, lock: str, lookup: Callable[[], T | None]) -> T | None:
        """Poll until the other process's value appears (it), its error appears (raise), or
        its lock is gone with neither (None: try to lead)."""
        self.waits += 1
        pause = POLL_START_S
        while True:
            value = lookup()
            if value is not None:
                return value
            try:
                holder = self._client.get(lock)
                failed = self._client.get(ERROR_PREFIX + key)
            except Exception:
                return None
            if failed is not None:
                failed_token, _, message = failed.decode(errors="replace").partition("|")
                # Only the failure of the leader we were waiting for counts, not an old one.
                if holder is None or holder.decode() == failed_token:
                    raise LeaderFailedError(message)
            if holder is None:
                return lookup()
            time.sleep(pause)
            pause = min(pause * 2, POLL_MAX_S)

    def _leave_error(self, key: str, token: str, err: BaseException, sensitive: bool) -> None:
        # A sensitive key's error message may quote its data: only the type leaves the process.
        message = type(err).__name__ if sensitive else f"{type(err).__name__}: {err}"
        with contextlib.suppress(Exception):
            self._client.set(ERROR_PREFIX + key, f"{token}|{message}", px=ERROR_TTL_MS)

    def _unlock(self, lock: str, token: str) -> None:
        try:
            assert self._release is not None
            self._release(keys=[lock], args=[token])
        except Exception as err:
            logger.debug("single-flight unlock failed (the lock will expire): %s", err)
