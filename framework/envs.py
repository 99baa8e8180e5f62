"""Every environment variable hetero reads, parsed strictly, in one place.

=============================  ==========================================================
``HETERO_PLUGINS``             Comma-separated allow-list of out-of-tree plugin names
                               (entry point names in ``hetero.backends`` and
                               ``hetero.plugins``). Unset: all are allowed.
``HETERO_BACKEND_AUTOLOAD``    ``1`` (default) discovers out-of-tree backends through entry
                               points; ``0`` loads only built-ins and backends named
                               explicitly.
``HETERO_LOG_LEVEL``           Log level for the CLI (``WARNING`` by default).
``HETERO_SIM_POLICY``          Policy whose ``devices.simulated`` the ``sim`` backend offers
                               when built through the registry (default
                               ``builtin:sim/mixed-fleet``).
``HETERO_MODEL_CACHE``         Where the built-in models keep derived files (exported ONNX,
                               converted weights, OpenVINO's compiled models); default
                               ``~/.cache/hetero/models``.
``HETERO_CALIBRATION_FILE``    Where warm-up keeps its timings between starts (JSON);
                               default ``calibration.json`` in the model cache.
``HETERO_VLLM_MAX_NUM_SEQS``   Sequences a vLLM engine schedules together (its continuous
                               batch, and the device's run slots); default 8.
``HETERO_VLLM_KV_CACHE_MB``    Memory a vLLM engine gives its KV cache, in MiB; default
                               512. It counts in the model's resident memory.
``HETERO_COMPILED``            ``1`` (default) imports the feature cache's hot modules from
                               their mypyc build when one matches the sources
                               (:mod:`hetero.cache.compiled`); ``0`` always imports the
                               ``.py`` files.
=============================  ==========================================================
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "EnvError",
    "backend_autoload",
    "calibration_file",
    "compiled_modules",
    "log_level",
    "model_cache",
    "plugin_allow_list",
    "sim_policy",
    "vllm_kv_cache_bytes",
    "vllm_max_num_seqs",
]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


class EnvError(ValueError):
    """An environment variable has a value hetero cannot parse."""


def plugin_allow_list() -> frozenset[str] | None:
    """Names in ``HETERO_PLUGINS``, or None when every plugin is allowed."""
    raw = os.environ.get("HETERO_PLUGINS")
    if raw is None or not raw.strip():
        return None
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def _switch(name: str, default: str) -> bool:
    """A 0/1 variable (also true/false, yes/no, on/off); :class:`EnvError` on anything else."""
    raw = os.environ.get(name, default).strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise EnvError(f"{name}: expected 0 or 1, got {raw!r}")


def backend_autoload() -> bool:
    """Whether out-of-tree backends are discovered through entry points."""
    return _switch("HETERO_BACKEND_AUTOLOAD", "1")


def compiled_modules() -> bool:
    """Whether the feature cache may import its compiled modules (``HETERO_COMPILED``)."""
    return _switch("HETERO_COMPILED", "1")


def log_level() -> str:
    """Log level for the CLI."""
    raw = os.environ.get("HETERO_LOG_LEVEL", "WARNING").strip().upper()
    if raw not in _LEVELS:
        raise EnvError(f"HETERO_LOG_LEVEL: expected one of {sorted(_LEVELS)}, got {raw!r}")
    return raw


def sim_policy() -> str:
    """Policy (path or ``builtin:<name>``) the sim backend reads its devices from."""
    return os.environ.get("HETERO_SIM_POLICY", "").strip() or "builtin:sim/mixed-fleet"


def model_cache() -> Path:
    """``HETERO_MODEL_CACHE``, or ``~/.cache/hetero/models`` when unset (user expanded)."""
    raw = os.environ.get("HETERO_MODEL_CACHE", "").strip()
    return Path(raw or "~/.cache/hetero/models").expanduser()


def calibration_file() -> Path:
    """``HETERO_CALIBRATION_FILE``, or ``calibration.json`` in :func:`model_cache`."""
    raw = os.environ.get("HETERO_CALIBRATION_FILE", "").strip()
    return Path(raw).expanduser() if raw else model_cache() / "calibration.json"


def _positive_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(f"{name}: expected a positive integer, got {raw!r}") from None
    if value < 1:
        raise EnvError(f"{name}: expected a positive integer, got {raw!r}")
    return value


def vllm_max_num_seqs() -> int:
    """``HETERO_VLLM_MAX_NUM_SEQS``: sequences one vLLM engine runs together (default 8)."""
    return _positive_int("HETERO_VLLM_MAX_NUM_SEQS", 8)


def vllm_kv_cache_bytes() -> int:
    """``HETERO_VLLM_KV_CACHE_MB`` in bytes: one vLLM engine's KV cache (default 512 MiB)."""
    return _positive_int("HETERO_VLLM_KV_CACHE_MB", 512) * 2**20
