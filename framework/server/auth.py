"""API keys: each names a principal, the highest QoS class it may use and its SLA tier.
``Authorization: Bearer KEY``; the class comes from the key or the ``X-Hetero-QoS`` header,
capped by what the key allows.

Keys are stored as salted scrypt hashes (:func:`hash_api_key`, ``hetero keys hash``) of keys of
at least :data:`MIN_KEY_LENGTH` characters; the unsalted sha256 hex of older policies is still
accepted, with a warning. Verification compares in constant time; a key that verified once is
remembered under a keyed hash for this process, so only a new or wrong key pays for scrypt
(:meth:`KeyRing.caller_async` runs that off the event loop). Failed attempts are logged and
throttled per client: after :data:`FAILURES_ALLOWED` within :data:`FAILURE_WINDOW_S` a client is
answered 429 without any key being checked, until the window has passed. A keys file that group
or others may read is refused.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import stat
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from hetero.framework.errors import PolicyValidationError
from hetero.framework.policy.schema import ApiKeyConfig, QosConfig, ServerConfig
from hetero.framework.server.errors import APIError
from hetero.sandbox.access import Principal

__all__ = ["ANONYMOUS", "MIN_KEY_LENGTH", "Caller", "KeyRing", "hash_api_key", "hash_key"]

logger = logging.getLogger(__name__)

ANONYMOUS = Principal("anonymous")
MIN_KEY_LENGTH = 32
SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P = 14, 8, 1  # 16 MiB, tens of milliseconds per check
FAILURES_ALLOWED = 10
FAILURE_WINDOW_S = 60.0
_TRACKED_CLIENTS = 10_000
_KEYS = TypeAdapter(tuple[ApiKeyConfig, ...])


def hash_key(key: str) -> str:
    """The unsalted sha256 hex of an API key, as older policies store it (``sha256:``)."""
    return hashlib.sha256(key.encode()).hexdigest()


def hash_api_key(key: str) -> str:
    """The salted scrypt hash a policy stores for ``key`` (``hash:``); keys shorter than
    :data:`MIN_KEY_LENGTH` characters are refused."""
    if len(key) < MIN_KEY_LENGTH:
        raise ValueError(
            f"an API key must have at least {MIN_KEY_LENGTH} characters (it has {len(key)}); "
            "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    salt = os.urandom(16)
    digest = _scrypt(key, salt, SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P)
    encoded = (base64.b64encode(part).decode() for part in (salt, digest))
    return f"scrypt${SCRYPT_LOG2_N}${SCRYPT_R}${SCRYPT_P}${'$'.join(encoded)}"


def _scrypt(key: str, salt: bytes, log2_n: int, r: int, p: int, length: int = 32) -> bytes:
    return hashlib.scrypt(
        key.encode(),
        salt=salt,
        n=2**log2_n,
        r=r,
        p=p,
        dklen=length,
        maxmem=2**26 + 128 * r * 2**log2_n,  # the work area, with room to spare
    )


@dataclass(frozen=True, slots=True)
class _Scrypt:
    log2_n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    @classmethod
    def parse(cls, text: str) -> _Scrypt:
        _, log2_n, r, p, salt, digest = text.split("$")  # the schema checked the shape
        try:
            parsed = cls(
                int(log2_n),
                int(r),
                int(p),
                base64.b64decode(salt, validate=True),
                base64.b64decode(digest, validate=True),
            )
        except binascii.Error as err:
            raise ValueError(f"not base64: {err}") from None
        if not (1 <= parsed.log2_n <= 20 and 1 <= parsed.r <= 32 and 1 <= parsed.p <= 16):
            raise ValueError("scrypt parameters out of range")
        if len(parsed.salt) < 16 or len(parsed.digest) < 32:
            raise ValueError("salt or digest too short")
        return parsed

    def matches(self, key: str) -> bool:
        computed = _scrypt(key, self.salt, self.log2_n, self.r, self.p, len(self.digest))
        return hmac.compare_digest(computed, self.digest)


class _FailureThrottle:
    """Failed authentications per client within a sliding window (a bounded table)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def wait_s(self, client: str) -> float:
        """Seconds until ``client`` may try again (0 when it may now)."""
        with self._lock:
            times = self._failures.get(client)
            if times is None or len(times) < FAILURES_ALLOWED:
                return 0.0
            return max(0.0, times[0] + FAILURE_WINDOW_S - self._clock())

    def failed(self, client: str) -> int:
        """Count a failure; how many ``client`` has in the window now."""
        now = self._clock()
        with self._lock:
            times = self._failures.pop(client, None) or deque(maxlen=FAILURES_ALLOWED)
            while times and times[0] <= now - FAILURE_WINDOW_S:
                times.popleft()
            times.append(now)
            self._failures[client] = times  # most recent last
            while len(self._failures) > _TRACKED_CLIENTS:
                self._failures.popitem(last=False)
            return len(times)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._failures.pop(client, None)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking, and at which QoS class."""

    principal: Principal
    qos_class: str
    sla_tier: str
    anonymous: bool
    subject: str | None = None  # the data subject the request's sensitive inputs are about


class KeyRing:
    """The keys of a policy (``server.api_keys`` plus ``server.api_keys_file``)."""

    def __init__(
        self,
        server: ServerConfig,
        qos: QosConfig,
        sla_tiers: frozenset[str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        keys = list(server.api_keys)
        if server.api_keys_file:
            keys += _read_keys_file(Path(server.api_keys_file).expanduser())
        for key in keys:
            if key.max_qos_class is not None and key.max_qos_class not in qos.classes:
                known = ", ".join(sorted(qos.classes))
                raise PolicyValidationError(
                    server.api_keys_file or "policy",
                    None,
                    f"api_keys[{key.name}].max_qos_class",
                    f"unknown QoS class {key.max_qos_class!r} (classes: {known})",
                )
            if key.sla_tier is not None and key.sla_tier not in sla_tiers:
                raise PolicyValidationError(
                    server.api_keys_file or "policy",
                    None,
                    f"api_keys[{key.name}].sla_tier",
                    f"unknown SLA tier {key.sla_tier!r} (tiers: {', '.join(sorted(sla_tiers))})",
                )
        self._scrypt = [(_parse_hash(key, server.api_keys_file), key) for key in keys if key.hash]
        self._legacy = [(bytes.fromhex(key.sha256), key) for key in keys if key.sha256]
        if self._legacy:
            names = ", ".join(key.name for _, key in self._legacy)
            logger.warning(
                "API keys stored as unsalted sha256 (%s): re-hash them with `hetero keys hash` "
                "(salted scrypt, at least %d characters)",
                names,
                MIN_KEY_LENGTH,
            )
        self._qos = qos
        self._verified: dict[bytes, ApiKeyConfig] = {}
        self._secret = os.urandom(32)  # keys the verified-key table, for this process only
        self._throttle = _FailureThrottle(clock)

    @property
    def open(self) -> bool:
        """No keys configured: anonymous callers are served (not on sensitive stages)."""
        return not (self._scrypt or self._legacy)

    def _remembered(self, token: str) -> bytes:
        return hmac.new(self._secret, token.encode(), hashlib.sha256).digest()

    def _find(self, token: str) -> ApiKeyConfig | None:
        """The key record ``token`` matches, checking every record in constant time each."""
        remembered = self._remembered(token)
        record = self._verified.get(remembered)
        if record is not None:
            return record
        digest = hashlib.sha256(token.encode()).digest()
        for stored, candidate in self._legacy:
            if hmac.compare_digest(digest, stored):
                record = candidate
        if record is None and len(token) >= MIN_KEY_LENGTH:
            for scrypt, candidate in self._scrypt:
                if scrypt.matches(token):
                    record = candidate
                    break
        if record is not None:
            self._verified[remembered] = record  # at most one entry per configured key
        return record

    def _refuse(self, client: str, message: str, code: str) -> APIError:
        count = self._throttle.failed(client)
        if count == 1:
            logger.warning("authentication failed from %s: %s", client or "?", message)
        elif count == FAILURES_ALLOWED:
            logger.warning(
                "authentication failed %d times in %g s from %s: refusing it for a while",
                count,
                FAILURE_WINDOW_S,
                client or "?",
            )
        else:
            logger.debug("authentication failed from %s: %s", client or "?", message)
        return APIError(401, message, code=code)

    async def caller_async(
        self, authorization: str | None, qos_header: str | None, client: str = ""
    ) -> Caller:
        """:meth:`caller` for the event loop: a key that needs scrypt (new or wrong) is
        checked in a worker thread, a remembered one at once."""
        _, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if not token or not self._scrypt or self._remembered(token) in self._verified:
            return self.caller(authorization, qos_header, client)
        return await asyncio.to_thread(self.caller, authorization, qos_header, client)

    def _weight(self, qos_class: str) -> float:
        return self._qos.classes[qos_class].weight

    def caller(self, authorization: str | None, qos_header: str | None, client: str = "") -> Caller:
        """The caller of a request; 401 for a missing or unknown key, 429 for a client with
        too many failed attempts, 400 for an unknown class. ``client`` (the peer address)
        is what failures are counted by."""
        record: ApiKeyConfig | None = None
        if authorization:
            wait_s = self._throttle.wait_s(client)
            if wait_s > 0 and not self.open:
                raise APIError(
                    429,
                    f"too many failed authentications from this client; retry in {wait_s:.0f} s",
                    code="too_many_failed_authentications",
                    retry_after_s=wait_s,
                )
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise self._refuse(
                    client, "the Authorization header must be 'Bearer <API key>'", "invalid_api_key"
                )
            record = self._find(token.strip())
            if record is None and not self.open:
                raise self._refuse(client, "invalid API key", "invalid_api_key")
            if record is not None:
                self._throttle.succeeded(client)
        elif not self.open:
            raise APIError(
                401,
                "missing API key: send 'Authorization: Bearer <API key>'",
                code="missing_api_key",
            )
        qos_class = self._qos.default_class
        if record is not None and record.max_qos_class is not None:
            qos_class = record.max_qos_class
        if qos_header:
            if qos_header not in self._qos.classes:
                known = ", ".join(sorted(self._qos.classes))
                raise APIError(
                    400,
                    f"X-Hetero-QoS: unknown QoS class {qos_header!r} (classes: {known})",
                    param="X-Hetero-QoS",
                    code="invalid_qos_class",
                )
            qos_class = qos_header
        cap = record.max_qos_class if record is not None else None
        if cap is None and record is None:
            cap = self._qos.default_class
        if cap is not None and self._weight(qos_class) > self._weight(cap):
            qos_class = cap
        tier = self._qos.classes[qos_class].sla_tier
        if record is not None and record.sla_tier is not None:
            tier = record.sla_tier
        if record is None:
            return Caller(ANONYMOUS, qos_class, tier, anonymous=True)
        principal = Principal(record.name, frozenset(record.roles), dict(record.attributes))
        return Caller(principal, qos_class, tier, anonymous=False)


def _parse_hash(key: ApiKeyConfig, source: str | None) -> _Scrypt:
    try:
        return _Scrypt.parse(str(key.hash))
    except ValueError as err:
        raise PolicyValidationError(
            source or "policy", None, f"api_keys[{key.name}].hash", f"not a scrypt hash: {err}"
        ) from None


def _read_keys_file(path: Path) -> list[ApiKeyConfig]:
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise PolicyValidationError(path, None, "server.api_keys_file", str(err)) from err
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PolicyValidationError(
            path,
            None,
            "server.api_keys_file",
            f"{path} is accessible to group or others (mode {stat.filemode(mode)}); "
            f"run: chmod 600 {path}",
        )
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        if isinstance(data, dict):
            data = data.get("api_keys", [])
        return list(_KEYS.validate_python(data or []))
    except (ValueError, yaml.YAMLError, ValidationError) as err:
        raise PolicyValidationError(path, None, "api_keys", str(err).splitlines()[0]) from err
