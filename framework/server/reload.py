"""Policy hot reload (``SIGHUP`` to ``hetero serve``, or ``POST /admin/policy/reload``): the
policy file is read and validated again, compared with the one serving, and swapped in at
once for new requests; a request that started before keeps the policy it started with (its
snapshot is pinned for the whole request by :class:`PinPolicy`).

Only what is read per request changes without a restart (:data:`HOT_PATHS`: SLA deadlines,
limits but those in :data:`COLD_PATHS`, API keys, retry and degrade settings, the name, a
stage's ``rollout``). A stage's ``model_version`` changes by a version swap
(:mod:`hetero.framework.server.rollout`): the new version is loaded and probed beside the old
before anything is swapped, and if it fails the whole reload is refused. A change anywhere
else (other stage keys, devices, partitions, cache, tracing, QoS classes...) needs its models
or workers built again: the reload is refused, naming those keys, and the old policy keeps
serving, as it does for a file that does not parse or validate (the error names its line).
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from hetero.framework.errors import PolicyError
from hetero.framework.policy import Policy, load_policy
from hetero.framework.server.auth import KeyRing
from hetero.framework.server.rollout import Rollout, RolloutFailedError

__all__ = [
    "COLD_PATHS",
    "HOT_PATHS",
    "PinPolicy",
    "PolicyReloader",
    "ReloadRefusedError",
    "ReloadReport",
    "RolloutFailedError",
    "changed_paths",
    "pinned_policy",
]

logger = logging.getLogger(__name__)

HOT_PATHS = (
    "name",
    "description",
    "sla_tiers",
    "server.limits",
    "server.api_keys",
    "server.api_keys_file",
    "server.retry_after_s",
    "server.degrade_queue_depth",
)

# Read once when the server starts (its middleware and the HTTP protocol): never hot.
COLD_PATHS = (
    "server.limits.max_body_bytes",
    "server.limits.body_timeout_s",
    "server.limits.header_timeout_s",
    "server.limits.max_header_bytes",
)

_pinned: contextvars.ContextVar[Policy | None] = contextvars.ContextVar(
    "hetero_policy", default=None
)


def pinned_policy() -> Policy | None:
    """The policy the current request started with (None outside a request)."""
    return _pinned.get()


class ReloadRefusedError(PolicyError, ValueError):
    """The new policy changes keys that need a restart; nothing was swapped."""

    def __init__(self, path: str, keys: list[str]) -> None:
        self.path = path
        self.keys = keys
        super().__init__(
            f"{path}: not reloaded: {', '.join(keys)} changed, which needs a restart "
            f"(reloadable: {', '.join(HOT_PATHS)})"
        )


@dataclass(frozen=True, slots=True)
class ReloadReport:
    """A reload that happened: the policy now serving, its file and the keys that changed."""

    policy: str
    source: str
    changed: tuple[str, ...]
    rollouts: tuple[Rollout, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "reloaded": True,
            "policy": self.policy,
            "source": self.source,
            "changed": list(self.changed),
            "rollouts": {r.stage: r.to_dict() for r in self.rollouts},
        }


def changed_paths(old: Any, new: Any, prefix: str = "") -> Iterator[str]:
    """Dotted key paths where two policy specs (or parts of them) differ."""
    if isinstance(old, BaseModel) and type(old) is type(new):
        for name in type(old).model_fields:
            yield from changed_paths(getattr(old, name), getattr(new, name), _join(prefix, name))
    elif isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in sorted(set(old) | set(new), key=str):
            path = _join(prefix, str(key))
            if key not in old or key not in new:
                yield path
            else:
                yield from changed_paths(old[key], new[key], path)
    elif old != new:
        yield prefix


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _hot(path: str) -> bool:
    if any(path == cold or path.startswith(cold + ".") for cold in COLD_PATHS):
        return False
    parts = path.split(".")
    if len(parts) >= 3 and parts[0] == "stages" and parts[2] == "rollout":
        return True  # read when a swap starts
    return any(path == hot or path.startswith(hot + ".") for hot in HOT_PATHS)


def _swapped_stage(path: str) -> str | None:
    """The stage whose model version ``path`` changes (``stages.<name>.model_version``)."""
    parts = path.split(".")
    if len(parts) == 3 and parts[0] == "stages" and parts[2] == "model_version":
        return parts[1]
    return None


class PolicyReloader:
    """Reloads the policy of a running server (one reload at a time).

    Args:
        runtime: The :class:`~hetero.framework.server.serving.Serving` whose policy is swapped.
        state: The app's state, whose ``keyring`` is rebuilt from the new policy.
        metrics_reloads: ``hetero_policy_reloads_total{outcome}``.
    """

    def __init__(self, runtime: Any, state: Any, metrics_reloads: Any) -> None:
        self.runtime = runtime
        self.state = state
        self._reloads = metrics_reloads
        self._lock = threading.Lock()

    def reload(self, path: str | Path | None = None) -> ReloadReport:
        """Validate the file (default: the serving policy's own) and swap it in.

        Raises:
            PolicyError: the file does not parse or validate (``.line`` says where), or
                :class:`ReloadRefusedError`; the old policy keeps serving either way.
        """
        with self._lock:
            old: Policy = self.runtime.policy
            source = str(path if path is not None else old.source)
            try:
                new = load_policy(source)
                changed = list(changed_paths(old.spec, new.spec))
                swaps = [s for p in changed if (s := _swapped_stage(p)) is not None]
                cold = [p for p in changed if not _hot(p) and _swapped_stage(p) is None]
                if cold:
                    raise ReloadRefusedError(source, cold)
                spec = new.spec
                keyring = KeyRing(spec.server, spec.qos, frozenset(spec.sla_tiers))
                rollouts = self._prepare(swaps, new)
            except PolicyError:
                self._reloads.labels("refused").inc()
                raise
            self.runtime.use_policy(new)
            self.state.keyring = keyring
            for rollout in rollouts:
                self.runtime.versions.start(rollout)
            self._reloads.labels("applied").inc()
            logger.info("policy %r reloaded from %s: %s", spec.name, source, changed or "no change")
            return ReloadReport(spec.name, source, tuple(changed), tuple(rollouts))

    def _prepare(self, stages: list[str], new: Policy) -> list[Rollout]:
        """Load and probe the new version of every stage in ``stages``; all or none (a
        failure unloads the ones already prepared and raises :class:`RolloutFailedError`)."""
        prepared: list[Rollout] = []
        try:
            for name in stages:
                prepared.append(self.runtime.versions.prepare(name, new.spec.stages[name]))
        except RolloutFailedError:
            for rollout in prepared:
                self.runtime.versions.discard(rollout)
            raise
        return prepared


class PinPolicy:
    """Pins the serving policy for the whole of each request: a reload while it runs does not
    change the limits, keys or deadlines it is judged by."""

    def __init__(self, app: ASGIApp, runtime: Any) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = _pinned.set(self.runtime.current_policy)
        try:
            await self.app(scope, receive, send)
        finally:
            _pinned.reset(token)
