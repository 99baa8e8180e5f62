"""What a device is (:class:`DeviceSpec`) and what it is doing now (:class:`Telemetry`)."""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyrsistent import pmap

__all__ = ["DeviceClass", "DeviceSpec", "Link", "LinkKind", "Telemetry"]


class DeviceClass(enum.StrEnum):
    """The family of a device; policies allow or deny stages by class."""

    CUDA = "cuda"
    ROCM = "rocm"
    NPU = "npu"
    CPU = "cpu"


class LinkKind(enum.StrEnum):
    """How two devices are connected."""

    NVLINK = "nvlink"
    XGMI = "xgmi"
    PCIE = "pcie"
    NETWORK = "network"


@dataclass(frozen=True, slots=True)
class Link:
    """A directed connection from the owning device to ``peer``."""

    peer: str
    kind: LinkKind
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.bandwidth_bytes_per_s <= 0:
            raise ValueError(f"link to {self.peer}: bandwidth must be positive")
        if self.latency_s < 0:
            raise ValueError(f"link to {self.peer}: latency must not be negative")


def _freeze_flops(value: Mapping[str, float]) -> Mapping[str, float]:
    for dtype, flops in value.items():
        if flops <= 0:
            raise ValueError(f"peak FLOP/s for {dtype} must be positive, got {flops}")
    return pmap(value)


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """What the hardware is: fixed facts the scheduler's cost model reads.

    Attributes:
        id: Unique across the process, ``<backend>:<local id>`` (``npu:openvino/CPU``, ``cuda:0``).
        device_class: The family, used by policy allow/deny rules.
        vendor_name: The name the vendor's runtime reports.
        backend: Name of the backend that owns the device.
        host: Host name the device lives on.
        memory_bytes: Memory usable for models.
        peak_flops: Peak FLOP/s per dtype (``fp32``, ``fp16``, ``bf16``, ``int8``).
        memory_bandwidth_bytes_per_s: Sustained memory bandwidth.
        links: Connections to other devices.
        numa_node: NUMA node of the device (or of the host memory for a CPU), if known.
        properties: Extra facts from the runtime (driver version, compute capability, ...).
    """

    id: str
    device_class: DeviceClass
    vendor_name: str
    backend: str
    host: str
    memory_bytes: int
    peak_flops: Mapping[str, float]
    memory_bandwidth_bytes_per_s: float
    links: tuple[Link, ...] = ()
    numa_node: int | None = None
    properties: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id or ":" not in self.id:
            raise ValueError(f"device id {self.id!r} must look like '<backend>:<local id>'")
        if self.memory_bytes <= 0:
            raise ValueError(f"{self.id}: memory_bytes must be positive")
        if self.memory_bandwidth_bytes_per_s <= 0:
            raise ValueError(f"{self.id}: memory bandwidth must be positive")
        if not self.peak_flops:
            raise ValueError(f"{self.id}: peak_flops needs at least one dtype")
        object.__setattr__(self, "device_class", DeviceClass(self.device_class))
        object.__setattr__(self, "peak_flops", _freeze_flops(self.peak_flops))
        object.__setattr__(self, "properties", pmap(self.properties))
        object.__setattr__(self, "links", tuple(self.links))

    def peak_flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``, falling back to fp32 and then to the slowest known dtype."""
        peak = self.peak_flops.get(dtype)  # one look-up of the persistent map, not two
        if peak is not None:
            return peak
        if "fp32" in self.peak_flops:
            return self.peak_flops["fp32"]
        return min(self.peak_flops.values())

    @property
    def physical_id(self) -> str:
        """The physical device this one is a runtime's view of, as ``<host>/<device id>``:
        a device that mirrors another names it in ``properties["serves"]`` (``vllm:cuda:0``
        serves ``cuda:0``); any other is its own."""
        return f"{self.host}/{self.properties.get('serves') or self.id}"

    @property
    def compute_id(self) -> str:
        """The physical compute this device runs on (see :attr:`resources`)."""
        return self.resources[0]

    @property
    def on_host_cores(self) -> bool:
        """Whether the device computes on its host's CPU cores: a runtime's view of the host
        CPU (OpenVINO's CPU, ONNX Runtime's CPU provider, torch on the CPU)."""
        return self.device_class is DeviceClass.CPU and self.compute_id.endswith("/cpu")

    @property
    def memory_id(self) -> str:
        """The physical memory this device's models live in (see :attr:`resources`)."""
        return self.resources[1]

    @property
    def resources(self) -> tuple[str, str]:
        """The physical resources the device draws on: ``(compute, memory)``.

        Devices that name the same resource share its capacity: the scheduler gives the
        devices of one compute resource one batch of a model in flight between them and
        weighs their backlog together, and those of one memory resource one memory budget.
        A runtime's view of the host CPU (``properties["shares_host_memory"]``: OpenVINO's
        CPU, ONNX Runtime's CPU provider, torch on the CPU) draws on ``<host>/cpu`` and
        ``<host>/memory``; an accelerator that uses host memory without computing on the
        cores (an iGPU, an NPU) draws on its own compute and ``<host>/memory``; a mirror
        (``properties["serves"]``) on what it serves; anything else on its own
        :attr:`physical_id`. ``properties["resources"]`` (``{"compute": ..., "memory":
        ...}``) names them explicitly, as a simulated fleet may."""
        named = self.properties.get("resources")
        physical = self.physical_id
        host_memory = bool(self.properties.get("shares_host_memory", False))
        compute = physical
        if host_memory and self.device_class is DeviceClass.CPU:
            compute = f"{self.host}/cpu"
        memory = f"{self.host}/memory" if host_memory else physical
        if isinstance(named, Mapping):
            compute = str(named.get("compute") or compute)
            memory = str(named.get("memory") or memory)
        return compute, memory

    def link_to(self, peer: str) -> Link | None:
        """The direct link to ``peer``, if there is one."""
        return next((link for link in self.links if link.peer == peer), None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (used by ``hetero devices --json``)."""
        return {
            "id": self.id,
            "class": self.device_class.value,
            "vendor_name": self.vendor_name,
            "backend": self.backend,
            "host": self.host,
            "memory_bytes": self.memory_bytes,
            "peak_flops": dict(self.peak_flops),
            "memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s,
            "links": [
                {
                    "peer": link.peer,
                    "kind": link.kind.value,
                    "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                    "latency_s": link.latency_s,
                }
                for link in self.links
            ],
            "numa_node": self.numa_node,
            "properties": {key: _jsonable(value) for key, value in self.properties.items()},
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return str(value)


@dataclass(frozen=True, slots=True)
class Telemetry:
    """What a device is doing at ``taken_at`` (seconds on the wall clock).

    ``power_watts`` is None where the runtime cannot read it (a CPU through OpenVINO).
    """

    device_id: str
    memory_used_bytes: int
    utilisation: float
    power_watts: float | None = None
    taken_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.memory_used_bytes < 0:
            raise ValueError(f"{self.device_id}: memory used must not be negative")
        if not 0.0 <= self.utilisation <= 1.0:
            raise ValueError(f"{self.device_id}: utilisation {self.utilisation} is outside 0-1")
