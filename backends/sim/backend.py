"""SimBackend: modelled execution on simulated devices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from hetero.backends.sim.timing import DEFAULT_NOMINAL_TOKENS, LlmSequences, modelled_run
from hetero.framework import envs
from hetero.framework.backend import Arrays, Backend, Executable, LoadedModel, batch_size
from hetero.framework.devices import DeviceSpec, Telemetry
from hetero.framework.errors import OutOfDeviceMemoryError
from hetero.framework.fleet import simulated_devices
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy

__all__ = ["SimBackend", "llm_sequences"]

# Inputs an LLM graph's run carries on the sim backend: one entry per sequence.
PROMPT_TOKENS, OUTPUT_TOKENS = "prompt_tokens", "output_tokens"


def llm_sequences(inputs: Arrays) -> LlmSequences:
    """Each sequence's prompt and output length from an LLM run's ``prompt_tokens`` and
    ``output_tokens`` inputs (one integer per sequence), and the nominal request's tokens from
    an optional scalar ``nominal_tokens``."""
    missing = [name for name in (PROMPT_TOKENS, OUTPUT_TOKENS) if name not in inputs]
    if missing:
        raise ValueError(
            f"an LLM graph on the sim backend needs inputs {missing}: one token count per "
            "sequence, as the simulator gives"
        )
    prompts = np.asarray(inputs[PROMPT_TOKENS]).reshape(-1).astype(int)
    outputs = np.asarray(inputs[OUTPUT_TOKENS]).reshape(-1).astype(int)
    nominal = inputs.get("nominal_tokens")
    return LlmSequences(
        tuple(int(t) for t in prompts),
        tuple(int(t) for t in outputs),
        DEFAULT_NOMINAL_TOKENS if nominal is None else float(np.asarray(nominal).reshape(-1)[0]),
    )


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
        if model.graph.hint.kv_bytes_per_token:
            llm_sequences(inputs)  # an LLM run without its token counts fails here, named
        return {}

    def _modelled_seconds(self, model: LoadedModel, inputs: Arrays) -> float:
        hint = model.graph.hint
        sequences = llm_sequences(inputs) if hint.kv_bytes_per_token else None
        return modelled_run(
            hint, self.device(model.device_id), batch_size(inputs), sequences
        ).seconds
