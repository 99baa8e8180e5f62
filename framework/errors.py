"""Every error hetero raises, in one tree.

Each class also subclasses the matching built-in, so callers that only know the standard
library still catch what they expect. Errors carry their context as attributes.

::

    HeteroError
    ├── PolicyError
    │   ├── PolicyNotFoundError(PolicyError, FileNotFoundError)     .path
    │   ├── PolicySyntaxError(PolicyError, ValueError)              .path .line
    │   └── PolicyValidationError(PolicyError, ValueError)          .path .line .key_path
    ├── InvalidInputError(HeteroError, ValueError)
    ├── PipelineError(HeteroError, ValueError)
    │   └── CyclicPipelineError                                     .cycle
    ├── BackendError
    │   ├── BackendUnavailableError(BackendError, RuntimeError)     .backend .reason
    │   ├── BackendLoadError(BackendError, ImportError)             .entry_point .remedy
    │   ├── UnknownBackendError(BackendError, KeyError)             .backend
    │   ├── CompileError(BackendError, RuntimeError)                .device .graph
    │   ├── ExecutionError(BackendError, RuntimeError)              .device .graph
    │   ├── TransferError(BackendError, RuntimeError)               .src .dst
    │   └── UnsupportedCapabilityError(BackendError, NotImplementedError)
    ├── SchedulingError(HeteroError, RuntimeError)
    │   ├── ShedError                                               .reason .status .retry_after_s
    │   │   └── QueueFullError                                      .stage .qos_class .bound
    │   ├── NoEligibleDeviceError                                   .stage .reasons
    │   ├── UnknownRouteError(SchedulingError, KeyError)            .route
    │   └── RequestTimeoutError(SchedulingError, TimeoutError)      .request_id
    ├── CacheError
    │   ├── CacheValueError(CacheError, TypeError)                 .value_type
    │   ├── CacheKeyError(CacheError, ValueError)                   .part
    │   └── CorruptEntryError(CacheError, ValueError)               .tier (read as a miss)
    └── DeviceError
        ├── UnknownDeviceError(DeviceError, KeyError)               .device
        ├── DeviceUnhealthyError(DeviceError, RuntimeError)         .device .reason
        ├── InputLostError(DeviceError, RuntimeError)               .devices
        └── OutOfDeviceMemoryError(DeviceError, MemoryError)        .device .requested .available
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BackendError",
    "BackendLoadError",
    "BackendUnavailableError",
    "CacheError",
    "CacheKeyError",
    "CacheValueError",
    "CompileError",
    "CorruptEntryError",
    "CyclicPipelineError",
    "DeviceError",
    "DeviceUnhealthyError",
    "ExecutionError",
    "HeteroError",
    "InputLostError",
    "InvalidInputError",
    "MissingProgramError",
    "NoEligibleDeviceError",
    "OutOfDeviceMemoryError",
    "PipelineError",
    "PolicyError",
    "PolicyNotFoundError",
    "PolicySyntaxError",
    "PolicyValidationError",
    "QueueFullError",
    "RequestTimeoutError",
    "SchedulingError",
    "ShedError",
    "TransferError",
    "UnknownBackendError",
    "UnknownDeviceError",
    "UnknownRouteError",
    "UnsupportedCapabilityError",
]


class HeteroError(Exception):
    """Base of every error raised by hetero."""


class PolicyError(HeteroError):
    """A policy file could not be read or is not valid."""


class PolicyNotFoundError(PolicyError, FileNotFoundError):
    """The policy file does not exist."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        super().__init__(f"{self.path}: policy file not found")

    def __str__(self) -> str:
        return f"{self.path}: policy file not found"


class PolicySyntaxError(PolicyError, ValueError):
    """The policy file is not valid YAML."""

    def __init__(self, path: Path | str, line: int | None, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: YAML syntax error: {problem}")


class PolicyValidationError(PolicyError, ValueError):
    """A value in the policy is wrong; the message names file, line and key path."""

    def __init__(self, path: Path | str, line: int | None, key_path: str, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.key_path = key_path
        self.problem = problem
        self.more: tuple[str, ...] = ()
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {key_path}: {problem}" if key_path else f"{where}: {problem}")


class InvalidInputError(HeteroError, ValueError):
    """A request's content cannot be used: undecodable image/audio, empty text, ...

    Raised by the model stages instead of the decoder's or runtime's own exception, so a server
    can answer 400 without knowing which library looked at the bytes.
    """


class MissingProgramError(HeteroError, FileNotFoundError):
    """A program a model needs at run time is not installed; the message says how to fix it.

    Attributes:
        program: The executable looked for on ``PATH``.
        package: The Debian package that provides it.
        fix: The command that installs it.
    """

    def __init__(self, program: str, package: str, needed_for: str) -> None:
        self.program = program
        self.package = package
        self.fix = f"apt-get install {package}"
        super().__init__(f"{program} is not installed ({needed_for}); fix: {self.fix}")


class PipelineError(HeteroError, ValueError):
    """A pipeline is not a valid DAG of stages."""


class CyclicPipelineError(PipelineError):
    """A pipeline's stages depend on each other in a cycle."""

    def __init__(self, pipeline: str, cycle: tuple[str, ...]) -> None:
        self.pipeline = pipeline
        self.cycle = cycle
        super().__init__(f"pipeline {pipeline!r} has a cycle: {' -> '.join(cycle)}")


class BackendError(HeteroError):
    """A backend failed; vendor exceptions are translated into subclasses of this."""


class BackendUnavailableError(BackendError, RuntimeError):
    """A backend cannot be used on this host."""

    def __init__(self, backend: str, reason: str) -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(f"{backend}: {reason}")


class BackendLoadError(BackendError, ImportError):
    """A backend plugin asked for by name could not be loaded."""

    def __init__(self, entry_point: str, problem: str, remedy: str) -> None:
        self.entry_point = entry_point
        self.remedy = remedy
        super().__init__(f"backend plugin {entry_point}: {problem}. {remedy}")


class UnknownBackendError(BackendError, KeyError):
    """No backend of that name is registered."""

    def __init__(self, backend: str, known: tuple[str, ...]) -> None:
        self.backend = backend
        self.known = known
        super().__init__(backend)

    def __str__(self) -> str:
        known = ", ".join(self.known) or "none"
        return f"no backend named {self.backend!r} (registered: {known})"


class CompileError(BackendError, RuntimeError):
    """A graph could not be compiled for a device."""

    def __init__(self, device: str, graph: str, problem: str) -> None:
        self.device = device
        self.graph = graph
        super().__init__(f"compiling {graph!r} for {device}: {problem}")


class ExecutionError(BackendError, RuntimeError):
    """A loaded graph failed while running."""

    def __init__(self, device: str, graph: str, problem: str) -> None:
        self.device = device
        self.graph = graph
        super().__init__(f"running {graph!r} on {device}: {problem}")


class TransferError(BackendError, RuntimeError):
    """Data could not be moved between devices."""

    def __init__(self, src: str, dst: str, problem: str) -> None:
        self.src = src
        self.dst = dst
        super().__init__(f"copying from {src} to {dst}: {problem}")


class UnsupportedCapabilityError(BackendError, NotImplementedError):
    """An optional capability (graph capture, peer copy) was used on a backend without it."""


class SchedulingError(HeteroError, RuntimeError):
    """A request could not be scheduled."""


class ShedError(SchedulingError):
    """Admission refused the request; clients should retry after ``retry_after_s``.

    ``status`` is the HTTP status the server answers with: 429 when the request itself is too
    heavy or its class is over its bound, 503 when the service as a whole is overloaded.
    """

    def __init__(self, reason: str, *, status: int = 429, retry_after_s: float = 1.0) -> None:
        self.reason = reason
        self.status = status
        self.retry_after_s = retry_after_s
        super().__init__(f"shed: {reason} (retry after {retry_after_s:.1f} s)")


class QueueFullError(ShedError):
    """A QoS class's queue for a stage is at its bound."""

    def __init__(self, stage: str, qos_class: str, bound: int) -> None:
        self.stage = stage
        self.qos_class = qos_class
        self.bound = bound
        super().__init__(
            f"queue of stage {stage!r} is full for class {qos_class!r} ({bound} queued)",
            status=429,
        )


class NoEligibleDeviceError(SchedulingError):
    """No device may run a stage; ``reasons`` says why, device by device."""

    def __init__(self, stage: str, reasons: dict[str, str]) -> None:
        self.stage = stage
        self.reasons = reasons
        detail = "; ".join(f"{d}: {r}" for d, r in sorted(reasons.items())) or "no devices"
        super().__init__(f"no eligible device for stage {stage!r} ({detail})")


class UnknownRouteError(SchedulingError, KeyError):
    """No route of the policy matches."""

    def __init__(self, route: str, known: tuple[str, ...]) -> None:
        self.route = route
        self.known = known
        super().__init__(route)

    def __str__(self) -> str:
        return f"unknown route {self.route!r} (routes: {', '.join(self.known) or 'none'})"


class RequestTimeoutError(SchedulingError, TimeoutError):
    """A request did not finish in time; its remaining work was cancelled."""

    def __init__(self, request_id: str, timeout_s: float) -> None:
        self.request_id = request_id
        super().__init__(f"request {request_id} timed out after {timeout_s:.3f} s")


class CacheError(HeteroError):
    """The feature cache refused an operation."""


class CacheValueError(CacheError, TypeError):
    """A value the cache cannot store without pickle."""

    def __init__(self, value_type: str, detail: str = "") -> None:
        self.value_type = value_type
        extra = f": {detail}" if detail else ""
        super().__init__(
            f"cannot cache a {value_type}{extra} (numpy arrays of numeric dtypes, or JSON-able "
            "dicts, lists, strings, numbers, booleans and None)"
        )


class CacheKeyError(CacheError, ValueError):
    """A cache key is missing a part."""

    def __init__(self, part: str) -> None:
        self.part = part
        super().__init__(f"cache key is missing its {part}")


class CorruptEntryError(CacheError, ValueError):
    """Bytes in a tier that do not decode: treated as a miss and removed."""

    def __init__(self, tier: str, problem: str) -> None:
        self.tier = tier
        super().__init__(f"{tier}: corrupt cache entry: {problem}")


class DeviceError(HeteroError):
    """A device-level failure."""


class UnknownDeviceError(DeviceError, KeyError):
    """No device with that id belongs to the backend."""

    def __init__(self, device: str) -> None:
        self.device = device
        super().__init__(device)

    def __str__(self) -> str:
        return f"unknown device {self.device!r}"


class DeviceUnhealthyError(DeviceError, RuntimeError):
    """A device stopped answering (NVML error mid-run, a reset); it is out of placement."""

    def __init__(self, device: str, reason: str) -> None:
        self.device = device
        self.reason = reason
        super().__init__(f"{device}: unhealthy: {reason}")


class InputLostError(DeviceError, RuntimeError):
    """A stage's inputs were kept on devices that are gone (a cluster node that left): the
    steps that made them must run again; the device that was to read them is not at fault."""

    def __init__(self, devices: tuple[str, ...], reason: str) -> None:
        self.devices = devices
        self.reason = reason
        super().__init__(f"inputs lost with {', '.join(devices) or 'their node'}: {reason}")


class OutOfDeviceMemoryError(DeviceError, MemoryError):
    """A device has no room for what was asked."""

    def __init__(self, device: str, requested: int, available: int) -> None:
        self.device = device
        self.requested = requested
        self.available = available
        super().__init__(
            f"{device}: out of memory: {requested} bytes requested, {available} available"
        )
