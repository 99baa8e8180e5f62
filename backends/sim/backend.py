"""SimBackend: modelled execution on simulated devices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from hetero.framework import envs
from hetero.framework.backend import Arrays, Backend, Executable, LoadedModel, batch_size
from hetero.framework.devices import DeviceSpec, Telemetry
from hetero.framework.errors import OutOfDeviceMemoryError
from hetero.framework.fleet import simulated_devices
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy

__all__ = ["SimBackend", "modelled_batch_seconds"]

# Fixed cost of one launch (kernel launches, synchronisation); NVIDIA quotes a few microseconds
# per kernel launch and a whole model takes tens of them.
LAUNCH_OVERHEAD_S = 20e-6


def modelled_batch_seconds(hint: BandwidthHint, device: DeviceSpec, batch: float) -> float:
    """Modelled duration of one batch on ``device``: the roofline batch time
    (:meth:`BandwidthHint.batch_seconds`: weights read once per batch) plus a launch overhead.
    ``batch`` may be fractional (items of different sizes add up to nominal items). The one
    formula: the sim backend reports it per run and the simulator uses it per batch, except
    for LLM stages (a hint with ``kv_bytes_per_token``), which the simulator models phase by
    phase with each request's tokens (:func:`hetero.backends.sim.llm.modelled_llm_batch`); a
    sim-backend run in the engine has no token counts and keeps this formula."""
    peak = device.peak_flops_for(hint.dtype)
    bandwidth = device.memory_bandwidth_bytes_per_s
    return LAUNCH_OVERHEAD_S + hint.batch_seconds(peak, bandwidth, batch)


class SimBackend(Backend):
    """Simulated devices with honest accounting and modelled durations."""

    name: ClassVar[str] = "sim"
    supports_peer_copy: ClassVar[bool] = True
    produces_outputs: ClassVar[bool] = False
    graph_formats: ClassVar[frozenset[GraphFormat]] = frozenset(GraphFormat)

    def __init__(self, devices: Sequence[DeviceSpec]) -> None:
        super().__init__()
        self._given = tuple(devices)

    @classmethod
    def from_env(cls) -> SimBackend:
        """Devices of the policy named by ``HETERO_SIM_POLICY``."""
        policy = load_policy(envs.sim_policy())
        return cls(simulated_devices(policy.spec.devices.simulated))

    def _discover(self) -> list[DeviceSpec]:
        return list(self._given)

    def _telemetry(self, device_id: str) -> Telemetry:
        used = self.memory_accounted(device_id)
        return Telemetry(device_id=device_id, memory_used_bytes=used, utilisation=0.0)

    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        if graph.format is GraphFormat.ONNX and isinstance(graph.source, bytes):
            import onnx

            model = onnx.load_from_string(graph.source)
            onnx.checker.check_model(model)
            initialised = {init.name for init in model.graph.initializer}
            inputs = tuple(i.name for i in model.graph.input if i.name not in initialised)
            return inputs, model.ByteSize()
        return graph.input_names, 0

    def _load(self, executable: Executable) -> tuple[Any, int]:
        inputs, serialized = executable.native
        need = max(executable.graph.hint.resident_bytes, serialized)
        device = self.device(executable.device_id)
        free = device.memory_bytes - self.memory_accounted(executable.device_id)
        if need > free:
            raise OutOfDeviceMemoryError(executable.device_id, need, free)
        return inputs, need

    def _unload(self, model: LoadedModel) -> None:
        model.native = None

    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        missing = [name for name in model.native if name not in inputs]
        if missing:
            raise ValueError(f"missing inputs: {missing}")
        return {}

    def _modelled_seconds(self, model: LoadedModel, inputs: Arrays) -> float:
        device = self.device(model.device_id)
        return modelled_batch_seconds(model.graph.hint, device, batch_size(inputs))
