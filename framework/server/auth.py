"""API keys: stored as sha256 hex, each naming a principal, the highest QoS class it may use
and its SLA tier. ``Authorization: Bearer KEY``; the class comes from the key or the
``X-Hetero-QoS`` header, capped by what the key allows."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from hetero.framework.errors import PolicyValidationError
from hetero.framework.policy.schema import ApiKeyConfig, QosConfig, ServerConfig
from hetero.framework.server.errors import APIError
from hetero.sandbox.access import Principal

__all__ = ["ANONYMOUS", "Caller", "KeyRing", "hash_key"]

ANONYMOUS = Principal("anonymous")
_KEYS = TypeAdapter(tuple[ApiKeyConfig, ...])


def hash_key(key: str) -> str:
    """The sha256 hex of an API key, as the policy stores it."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking, and at which QoS class."""

    principal: Principal
    qos_class: str
    sla_tier: str
    anonymous: bool


class KeyRing:
    """The keys of a policy (``server.api_keys`` plus ``server.api_keys_file``)."""

    def __init__(self, server: ServerConfig, qos: QosConfig, sla_tiers: frozenset[str]) -> None:
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
        self._by_hash = {key.sha256: key for key in keys}
        self._qos = qos

    @property
    def open(self) -> bool:
        """No keys configured: anonymous callers are served (not on sensitive stages)."""
        return not self._by_hash

    def _weight(self, qos_class: str) -> float:
        return self._qos.classes[qos_class].weight

    def caller(self, authorization: str | None, qos_header: str | None) -> Caller:
        """The caller of a request; 401 for a missing or unknown key, 400 for an unknown class."""
        record: ApiKeyConfig | None = None
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise APIError(
                    401,
                    "the Authorization header must be 'Bearer <API key>'",
                    code="invalid_api_key",
                )
            record = self._by_hash.get(hash_key(token.strip()))
            if record is None and not self.open:
                raise APIError(401, "invalid API key", code="invalid_api_key")
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


def _read_keys_file(path: Path) -> list[ApiKeyConfig]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise PolicyValidationError(path, None, "server.api_keys_file", str(err)) from err
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        if isinstance(data, dict):
            data = data.get("api_keys", [])
        return list(_KEYS.validate_python(data or []))
    except (ValueError, yaml.YAMLError, ValidationError) as err:
        raise PolicyValidationError(path, None, "api_keys", str(err).splitlines()[0]) from err
