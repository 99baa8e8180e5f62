"""torch execution on one device (``cpu``, ``cuda:N``): load/unload with measured memory, run,
peer copy, and static-shape graph capture (CUDA Graph; HIP Graph through the same API on ROCm
builds of torch).

ROCm builds of torch expose HIP through ``torch.cuda``, so the cuda and rocm backends share this
executor (``torch.version.hip`` is set there); the npu backend runs torch graphs on the host CPU
with it. Capture falls back to eager, with the reason logged,
whenever a graph cannot be captured (a CPU-only build, dynamic control flow, an op that
synchronises).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CapturedGraph", "TorchExecutor", "outputs_by_name"]

logger = logging.getLogger(__name__)

WARMUP_RUNS = 3


def outputs_by_name(result: Any) -> dict[str, np.ndarray[Any, Any]]:
    """A module's result as named host arrays: ``output``, ``output_<i>`` or the dict's keys."""
    if isinstance(result, Mapping):
        return {str(k): _to_numpy(v) for k, v in result.items()}
    if isinstance(result, list | tuple):
        return {f"output_{i}": _to_numpy(v) for i, v in enumerate(result)}
    return {"output": _to_numpy(result)}


def _to_numpy(value: Any) -> np.ndarray[Any, Any]:
    if hasattr(value, "detach"):
        return np.asarray(value.detach().to("cpu").numpy())
    return np.asarray(value)


@dataclass
class CapturedGraph:
    """A captured graph with its static input and output buffers."""

    graph: Any
    static_inputs: dict[str, Any]
    static_output: Any

    def matches(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> bool:
        """Whether ``inputs`` fit the captured static shapes and dtypes."""
        if inputs.keys() != self.static_inputs.keys():
            return False
        return all(
            tuple(self.static_inputs[n].shape) == tuple(np.shape(a))
            and str(self.static_inputs[n].dtype).removeprefix("torch.") == np.asarray(a).dtype.name
            for n, a in inputs.items()
        )


class TorchExecutor:
    """Runs torch modules on one device (``cuda:0``; ``cpu`` in tests of this code)."""

    def __init__(self, device: str, memory_in_use: Callable[[], int] | None = None) -> None:
        import torch

        self._torch = torch
        self.device = device
        self._memory_in_use = memory_in_use or (lambda: 0)
        self.version = str(torch.__version__)

    def set_threads(self, threads: int) -> None:
        """Intra-op threads for CPU work (process-wide in torch); 0 leaves torch's default."""
        if threads > 0 and self._torch.get_num_threads() != threads:
            self._torch.set_num_threads(threads)

    def prepare(self, factory: Callable[[], Any]) -> Any:
        """Build the module on the host, in eval mode."""
        module = factory()
        if not isinstance(module, self._torch.nn.Module):
            raise TypeError(f"factory returned {type(module).__name__}, not a torch.nn.Module")
        return module.eval()

    def load(self, module: Any) -> tuple[Any, int]:
        """Move ``module`` to the device; its bytes are the measured growth, at least its
        parameters and buffers."""
        before = self._memory_in_use()
        moved = module.to(self.device)
        self.synchronize()
        grown = max(0, self._memory_in_use() - before)
        tensors = [*moved.parameters(), *moved.buffers()]
        own = sum(t.numel() * t.element_size() for t in tensors)
        return moved, max(grown, own)

    def unload(self, module: Any) -> None:
        """Drop the module and give cached blocks back to the driver (for real: other servers
        leak here by keeping the caching allocator's blocks)."""
        module.to("meta")
        del module
        gc.collect()
        if self.device.startswith("cuda") and self._torch.cuda.is_available():
            self._torch.cuda.empty_cache()

    def synchronize(self) -> None:
        """Wait for queued work on the device."""
        if self.device.startswith("cuda") and self._torch.cuda.is_available():
            self._torch.cuda.synchronize(self.device)

    def _tensors(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
        return {
            name: self._torch.as_tensor(np.asarray(array, order="C")).to(
                self.device, non_blocking=True
            )
            for name, array in inputs.items()
        }

    def run(
        self,
        module: Any,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        captured: CapturedGraph | None = None,
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Run eagerly, or replay ``captured`` when the inputs fit its static shapes."""
        with self._torch.inference_mode():
            if captured is not None and captured.matches(inputs):
                for name, array in inputs.items():
                    captured.static_inputs[name].copy_(self._torch.as_tensor(array))
                captured.graph.replay()
                return outputs_by_name(captured.static_output)
            return outputs_by_name(module(**self._tensors(inputs)))

    def capture(
        self, module: Any, example_inputs: Mapping[str, np.ndarray[Any, Any]]
    ) -> tuple[CapturedGraph | None, str]:
        """Capture ``module`` on static shapes; (None, reason) when it cannot be captured."""
        torch = self._torch
        if not self.device.startswith("cuda") or not torch.cuda.is_available():
            return None, f"no CUDA/HIP device behind {self.device!r} in this torch build"
        try:
            graph = torch.cuda.CUDAGraph()
            static_inputs = self._tensors(example_inputs)
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.inference_mode(), torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    module(**static_inputs)
            torch.cuda.current_stream(self.device).wait_stream(side)
            with torch.inference_mode(), torch.cuda.graph(graph):
                static_output = module(**static_inputs)
        except Exception as err:  # capture errors are many and vendor-specific
            return None, f"{type(err).__name__}: {err}"
        return CapturedGraph(graph, static_inputs, static_output), "captured"

    def copy(self, array: Any, dst_device: str, peer_ok: bool) -> Any:
        """Move a tensor (or array) to ``dst_device``: directly where peer access works,
        through pinned host memory otherwise."""
        tensor = array if hasattr(array, "to") else self._torch.as_tensor(np.asarray(array))
        if peer_ok or tensor.device.type == "cpu":
            return tensor.to(dst_device, non_blocking=True)
        staged = tensor.to("cpu")
        if self._torch.cuda.is_available():
            staged = staged.pin_memory()
        return staged.to(dst_device, non_blocking=True)
