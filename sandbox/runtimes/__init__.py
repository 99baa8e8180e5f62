"""Sandbox runtimes behind one interface (:class:`SandboxRuntime`), all fed by one OCI spec."""

from hetero.sandbox.runtimes.base import (
    Availability,
    IsolationLevel,
    RunOutcome,
    RuntimeMissingError,
    SandboxRunError,
    SandboxRuntime,
)
from hetero.sandbox.runtimes.bwrap import BwrapRuntime
from hetero.sandbox.runtimes.containerd import ContainerdDaemon, ContainerdRuntime, ShimMissingError
from hetero.sandbox.runtimes.gvisor import GvisorRuntime
from hetero.sandbox.runtimes.kata import KataNotInstalledError, KataRuntime
from hetero.sandbox.runtimes.runc import RuncRuntime

__all__ = [
    "Availability",
    "BwrapRuntime",
    "ContainerdDaemon",
    "ContainerdRuntime",
    "GvisorRuntime",
    "IsolationLevel",
    "KataNotInstalledError",
    "KataRuntime",
    "RunOutcome",
    "RuncRuntime",
    "RuntimeMissingError",
    "SandboxRunError",
    "SandboxRuntime",
    "ShimMissingError",
]
