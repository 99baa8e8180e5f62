"""Backends and plugins, found through entry points or registered in code.

Two entry point groups, named once here:

* ``hetero.backends``: value ``module:detect``; ``detect()`` returns a :class:`Detection`, cheaply
  (it imports only the vendor probe and never touches a device at import time).
* ``hetero.plugins``: value ``module:register``; ``register(registry)`` adds stages, cache tiers,
  sandbox runtimes or routing rules.

Several backends live side by side, ranked by priority. A broken plugin is logged with its name
and skipped; asking for it by name raises :class:`BackendLoadError` with a remedy. Built-in
backends (entry points whose module is under ``hetero.``) always load;
``HETERO_BACKEND_AUTOLOAD=0`` stops discovery of the others unless they are named, and
``HETERO_PLUGINS`` allow-lists them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from hetero.framework import envs
from hetero.framework.backend import Backend
from hetero.framework.errors import (
    BackendLoadError,
    BackendUnavailableError,
    UnknownBackendError,
)

__all__ = [
    "BACKENDS_GROUP",
    "PLUGINS_GROUP",
    "Detection",
    "Registry",
    "default_registry",
]

logger = logging.getLogger(__name__)

BACKENDS_GROUP = "hetero.backends"
PLUGINS_GROUP = "hetero.plugins"
_BUILTIN_PREFIX = "hetero."


@dataclass(frozen=True, slots=True)
class Detection:
    """A backend's answer to "can you run here?", with the reason when it cannot.

    Attributes:
        name: Backend name.
        available: Whether :attr:`factory` may be called.
        reason: Why not (``NVML library not found``), or what was found.
        factory: Builds the backend; None when unavailable.
        priority: Higher ranks first in listings; placement itself goes by estimated cost.
        simulated: Its devices are modelled, not hardware: host discovery leaves it out.
    """

    name: str
    available: bool
    reason: str
    factory: Callable[[], Backend] | None = None
    priority: int = 0
    simulated: bool = False

    @classmethod
    def found(
        cls,
        name: str,
        factory: Callable[[], Backend],
        reason: str = "",
        priority: int = 0,
        *,
        simulated: bool = False,
    ) -> Detection:
        """An available backend."""
        return cls(
            name=name,
            available=True,
            reason=reason,
            factory=factory,
            priority=priority,
            simulated=simulated,
        )

    @classmethod
    def missing(cls, name: str, reason: str) -> Detection:
        """An unavailable backend and why."""
        return cls(name=name, available=False, reason=reason)


@dataclass(frozen=True, slots=True)
class _Source:
    name: str
    detect: Callable[[], Detection] | None
    entry_point: EntryPoint | None
    builtin: bool


class Registry:
    """Known backends (detected lazily, instantiated once) and loaded plugins."""

    def __init__(self, *, use_entry_points: bool = True) -> None:
        self._use_entry_points = use_entry_points
        self._sources: dict[str, _Source] | None = None
        self._extra: dict[str, _Source] = {}
        self._detections: dict[str, Detection] = {}
        self._broken: dict[str, str] = {}
        self._instances: dict[str, Backend] = {}
        self._plugins_loaded = False
        self._extensions: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()

    # --- registration ------------------------------------------------------------------------

    def register_backend(self, name: str, detect: Callable[[], Detection]) -> None:
        """Register a backend in code, beside those from entry points."""
        with self._lock:
            self._extra[name] = _Source(name, detect, None, builtin=True)
            self._detections.pop(name, None)
            self._instances.pop(name, None)
            self._broken.pop(name, None)

    def register(self, kind: str, name: str, obj: Any) -> None:
        """Register an extension (``stage``, ``cache_tier``, ``sandbox_runtime``, ...) by name."""
        with self._lock:
            self._extensions.setdefault(kind, {})[name] = obj

    def extensions(self, kind: str) -> dict[str, Any]:
        """Extensions of one kind, after loading ``hetero.plugins``."""
        self.load_plugins()
        with self._lock:
            return dict(self._extensions.get(kind, {}))

    # --- discovery ---------------------------------------------------------------------------

    def _all_sources(self) -> dict[str, _Source]:
        with self._lock:
            if self._sources is None:
                found: dict[str, _Source] = {}
                if self._use_entry_points:
                    for ep in entry_points(group=BACKENDS_GROUP):
                        source = _Source(ep.name, None, ep, _is_builtin(ep))
                        # On a name clash the built-in wins: a plugin cannot shadow "cuda".
                        if ep.name not in found or (source.builtin and not found[ep.name].builtin):
                            found[ep.name] = source
                self._sources = found
            return {**self._sources, **self._extra}

    def names(self) -> tuple[str, ...]:
        """Backends that discovery lists (built-ins, plus allowed out-of-tree ones)."""
        autoload = envs.backend_autoload()
        allow = envs.plugin_allow_list()

        def listed(source: _Source) -> bool:
            if source.builtin:
                return True
            return autoload and (allow is None or source.name in allow)

        return tuple(sorted(n for n, s in self._all_sources().items() if listed(s)))

    def detect(self, name: str) -> Detection:
        """Run (once) and return ``name``'s detection; a broken plugin detects as unavailable."""
        with self._lock:
            if name in self._detections:
                return self._detections[name]
            sources = self._all_sources()
            if name not in sources:
                raise UnknownBackendError(name, tuple(sorted(sources)))
            source = sources[name]
            try:
                detect = source.detect or _load_entry_point(source)
                detection = detect()
                if not isinstance(detection, Detection):
                    raise TypeError(f"detect() returned {type(detection).__name__}, not Detection")
            except Exception as err:
                problem = f"{type(err).__name__}: {err}"
                logger.warning("backend plugin %r is broken and was skipped: %s", name, problem)
                self._broken[name] = problem
                detection = Detection.missing(name, f"plugin failed to load: {problem}")
            self._detections[name] = detection
            return detection

    def detections(self) -> tuple[Detection, ...]:
        """Every listed backend's detection, available ones first, by priority."""
        found = [self.detect(name) for name in self.names()]
        return tuple(sorted(found, key=lambda d: (not d.available, -d.priority, d.name)))

    def backend(self, name: str) -> Backend:
        """The backend asked for by name, instantiated once.

        Raises:
            UnknownBackendError: no such backend.
            BackendLoadError: its plugin is broken or not allowed; the message gives the remedy.
            BackendUnavailableError: it cannot run on this host; the message says why.
        """
        with self._lock:
            if name in self._instances:
                return self._instances[name]
            sources = self._all_sources()
            source = sources.get(name)
            if source is None:
                raise UnknownBackendError(name, tuple(sorted(sources)))
            allow = envs.plugin_allow_list()
            if not source.builtin and allow is not None and name not in allow:
                raise BackendLoadError(
                    _describe_entry_point(source),
                    f"not in HETERO_PLUGINS ({','.join(sorted(allow))})",
                    f"Add {name!r} to HETERO_PLUGINS or unset it.",
                )
            detection = self.detect(name)
            if name in self._broken:
                raise BackendLoadError(
                    _describe_entry_point(source),
                    self._broken[name],
                    "Reinstall the package that provides it, or remove it from the policy.",
                )
            if not detection.available or detection.factory is None:
                raise BackendUnavailableError(name, detection.reason)
            try:
                instance = detection.factory()
            except Exception as err:
                problem = f"failed to start: {type(err).__name__}: {err}"
                logger.warning("backend %r %s", name, problem)
                self._broken[name] = problem
                raise BackendLoadError(
                    _describe_entry_point(source),
                    problem,
                    "Check the vendor runtime's installation, or deny the backend in the policy.",
                ) from err
            self._instances[name] = instance
            return instance

    def available_backends(self) -> tuple[Backend, ...]:
        """Instances of every available listed backend, highest priority first."""
        return tuple(self.backend(d.name) for d in self.detections() if d.available)

    # --- plugins -----------------------------------------------------------------------------

    def load_plugins(self) -> None:
        """Call ``register(self)`` for every allowed ``hetero.plugins`` entry point, once."""
        with self._lock:
            if self._plugins_loaded or not self._use_entry_points:
                self._plugins_loaded = True
                return
            self._plugins_loaded = True
            allow = envs.plugin_allow_list()
            for ep in entry_points(group=PLUGINS_GROUP):
                if not _is_builtin(ep) and allow is not None and ep.name not in allow:
                    continue
                try:
                    ep.load()(self)
                except Exception as err:
                    logger.warning(
                        "plugin %r (%s) is broken and was skipped: %s: %s",
                        ep.name,
                        ep.value,
                        type(err).__name__,
                        err,
                    )


def _is_builtin(ep: EntryPoint) -> bool:
    """An entry point of the hetero distribution itself (not merely a module under hetero.)."""
    dist = getattr(ep, "dist", None)
    if dist is not None:
        return bool(dist.name == "hetero")
    return ep.value.startswith(_BUILTIN_PREFIX)


def _load_entry_point(source: _Source) -> Callable[[], Detection]:
    assert source.entry_point is not None
    loaded = source.entry_point.load()
    if not callable(loaded):
        raise TypeError(f"{source.entry_point.value} is not callable")
    return loaded  # type: ignore[no-any-return]


def _describe_entry_point(source: _Source) -> str:
    if source.entry_point is None:
        return f"{source.name} (registered in code)"
    return f"{BACKENDS_GROUP}:{source.name} = {source.entry_point.value}"


_default: Registry | None = None
_default_lock = threading.Lock()


def default_registry() -> Registry:
    """The process-wide registry used by the CLI and the engine."""
    global _default  # noqa: PLW0603
    with _default_lock:
        if _default is None:
            _default = Registry()
        return _default
