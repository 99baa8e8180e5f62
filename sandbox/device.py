"""A partition's sandbox as a device: the scheduler places a sensitive stage only there.

:class:`SandboxBackend` offers one device per served partition, ``sandbox:<partition>``. It
takes no graph formats, so no other stage is ever placed on it; the sandboxed stage plugins
(:class:`hetero.sandbox.serving.SandboxedStage`) load nothing on the host and name it as their
only device. Register it for a policy with :func:`register_sandbox_devices`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from hetero.framework.backend import Arrays, Backend, Executable, LoadedModel
from hetero.framework.devices import DeviceClass, DeviceSpec, Telemetry
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.registry import Detection, Registry

__all__ = ["SANDBOX_BACKEND", "SandboxBackend", "register_sandbox_devices", "sandbox_device"]

SANDBOX_BACKEND = "sandbox"
_HOST_FLOPS = 1e11  # a placeholder the cost model never weighs: sandboxed stages cost nothing here
_HOST_BANDWIDTH = 1e10


def sandbox_device(partition: str) -> str:
    """The device id of ``partition``'s sandbox."""
    return f"{SANDBOX_BACKEND}:{partition}"


class SandboxBackend(Backend):
    """One device per partition; runs no graphs (the sandbox worker runs the model inside)."""

    name: ClassVar[str] = SANDBOX_BACKEND
    graph_formats: ClassVar[frozenset[GraphFormat]] = frozenset()

    def __init__(self, partitions: Iterable[str], memory_bytes: int) -> None:
        super().__init__()
        self._partitions = tuple(partitions)
        self._memory_bytes = memory_bytes

    def _discover(self) -> list[DeviceSpec]:
        return [
            DeviceSpec(
                id=sandbox_device(partition),
                device_class=DeviceClass.CPU,
                vendor_name=f"sandbox of partition {partition}",
                backend=self.name,
                host="localhost",
                memory_bytes=self._memory_bytes,
                peak_flops={"fp32": _HOST_FLOPS},
                memory_bandwidth_bytes_per_s=_HOST_BANDWIDTH,
                numa_node=0,
                properties={"partition": partition, "runtime": "sandbox"},
            )
            for partition in self._partitions
        ]

    def _telemetry(self, device_id: str) -> Telemetry:
        return Telemetry(device_id=device_id, memory_used_bytes=0, utilisation=0.0)

    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        raise ValueError(f"{device_id} runs sandboxed stages only, not graphs")

    def _load(self, executable: Executable) -> tuple[Any, int]:
        raise ValueError(f"{executable.device_id} runs sandboxed stages only, not graphs")

    def _unload(self, model: LoadedModel) -> None:
        model.native = None

    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        raise ValueError(f"{model.device_id} runs sandboxed stages only, not graphs")


def register_sandbox_devices(
    registry: Registry, partitions: Iterable[str], memory_bytes: int
) -> None:
    """Make ``partitions``' sandboxes devices of ``registry`` (this process only)."""
    names = tuple(partitions)

    def detect() -> Detection:
        return Detection.found(
            SANDBOX_BACKEND,
            lambda: SandboxBackend(names, memory_bytes),
            reason=f"sandboxes of {', '.join(names) or 'no partition'}",
        )

    registry.register_backend(SANDBOX_BACKEND, detect)
