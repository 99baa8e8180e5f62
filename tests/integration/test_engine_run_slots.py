"""A device whose runtime takes several runs at once (a vLLM engine's continuous batch), through
the one path: engine -> scheduler -> lane -> plugin -> runner -> backend.

The backend here is a named fake of the vllm backend (no vLLM in this venv; the real one is in
tests/vllm/, run by ``make test-vllm``): a device with ``run_slots`` N whose native handle is a
text engine that holds every generation at a barrier of N parties. All N generations can only
pass it if the lane runs them at the same time; a lane that ran them one after another would
break the barrier (its timeout is a failure, not a synchronisation).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import wait
from typing import Any, ClassVar

import numpy as np
import pytest

from hetero.framework.backend import Arrays, Backend, Executable, LoadedModel
from hetero.framework.devices import DeviceClass, DeviceSpec, Telemetry
from hetero.framework.engine import Engine
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Detection, Registry
from hetero.framework.stage_plugin import Generation, GraphRunner, StagePlugin, each
from hetero.framework.text_engine import GenerationOutcome, SamplingSpec, TextEngine

POLICY = """\
version: 1
devices: {allow: [cpu]}
stages:
  gen:
    modality: text
    variants:
      full: {batchable: false, max_batch: 1}
pipelines:
  chat: {steps: [{stage: gen}]}
routes: {/chat: chat}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t, queue_bound: 64}}
sla_tiers: {t: {deadline_ms: 60000}}
"""

TORCH_RESIDENT = 10 * 2**20  # weights alone
ENGINE_RESIDENT = 10 * 2**20 + 64 * 2**20  # weights plus the engine's KV cache
BARRIER_TIMEOUT_S = 60.0


class BarrierEngine(TextEngine):
    """A text engine that lets a generation finish only once ``parties`` are inside it."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=BARRIER_TIMEOUT_S)
        self.lock = threading.Lock()
        self.inside = 0
        self.peak = 0

    def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingSpec,
        on_text: Callable[[str], None],
        stop: threading.Event,
    ) -> GenerationOutcome:
        with self.lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
        try:
            self.barrier.wait()
        finally:
            with self.lock:
                self.inside -= 1
        on_text("ok")
        return GenerationOutcome("ok", len(prompt_ids), 1, "stop")


class SlottedBackend(Backend):
    """One CPU device whose graphs in the vllm format run ``slots`` at a time."""

    name: ClassVar[str] = "slotted"
    graph_formats: ClassVar[frozenset[GraphFormat]] = frozenset({GraphFormat.VLLM})
    slots: ClassVar[int] = 1
    engines: ClassVar[list[BarrierEngine]] = []

    def _discover(self) -> list[DeviceSpec]:
        return [
            DeviceSpec(
                id="slotted:0",
                device_class=DeviceClass.CPU,
                vendor_name="fake engine",
                backend=self.name,
                host="here",
                memory_bytes=8 * 2**30,
                peak_flops={"fp32": 1e11},
                memory_bandwidth_bytes_per_s=1e10,
            )
        ]

    def _telemetry(self, device_id: str) -> Telemetry:
        return Telemetry(device_id=device_id, memory_used_bytes=0, utilisation=0.0)

    def run_slots(self, device_id: str, graph_format: GraphFormat) -> int:
        return self.slots if graph_format is GraphFormat.VLLM else 1

    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        return graph.source

    def _load(self, executable: Executable) -> tuple[Any, int]:
        engine = BarrierEngine(self.slots)
        self.engines.append(engine)
        return engine, executable.graph.hint.resident_bytes

    def _unload(self, model: LoadedModel) -> None:
        pass

    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        raise AssertionError("a text engine is driven through its native handle")


class Generator(StagePlugin):
    """A torch graph (weights only) or an engine graph (weights plus KV cache)."""

    name = "gen"

    @property
    def formats(self) -> tuple[GraphFormat, ...]:
        return (GraphFormat.TORCH, GraphFormat.VLLM)

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        chosen = graph_format or GraphFormat.TORCH
        resident = ENGINE_RESIDENT if chosen is GraphFormat.VLLM else TORCH_RESIDENT
        hint = BandwidthHint(1e6, 1e6, resident_bytes=resident, batchable=False, max_batch=1)
        source: Any = "model-folder" if chosen is GraphFormat.VLLM else object
        return {"decoder": ComputeGraph("gen/decoder", chosen, source, hint)}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        engine = runner.native("decoder")
        spec = SamplingSpec(max_tokens=4)
        return each(lambda job: engine.generate([1, 2], spec, job.on_piece, job.stop), payloads)


def engine_with_slots(slots: int) -> tuple[Engine, type[SlottedBackend]]:
    backend = type("Slotted", (SlottedBackend,), {"slots": slots, "engines": []})
    registry = Registry(use_entry_points=False)
    registry.register_backend("slotted", lambda: Detection.found("slotted", backend))
    policy = load_policy_text(POLICY, "run-slots")
    return Engine(policy, registry, plugins={"gen": Generator()}), backend


@pytest.mark.parametrize("slots", [1, 4])
def test_a_lane_runs_as_many_generations_at_once_as_its_device_has_slots(slots: int) -> None:
    engine, backend = engine_with_slots(slots)
    with engine:
        assert engine.warm_up() == {}
        jobs = [Generation([{"role": "user", "content": f"{i}"}], max_tokens=4) for i in range(8)]
        futures = [engine.submit_stage("gen", job) for job in jobs]
        done, _ = wait(futures, timeout=2 * BARRIER_TIMEOUT_S)
        results = [f.result() for f in futures]
    assert len(done) == 8
    assert [r.outputs["gen"].text for r in results] == ["ok"] * 8
    assert {r.devices["gen"] for r in results} == {"slotted:0"}
    (loaded,) = backend.engines
    assert loaded.peak == slots  # never more than its slots, and all of them used
    assert engine.admission.run_slots("gen") == slots  # admission: the queue drains N at once


def test_the_engine_format_s_kv_cache_counts_in_the_memory_plan() -> None:
    engine, _ = engine_with_slots(2)
    with engine:
        assert engine.warm_up() == {}
        index = engine.scheduler.fleet.index["slotted:0"]
        # The stage's own hint is the torch graph's; on this device it runs as an engine
        # whose KV cache the memory manager must hold room for.
        assert engine.scheduler.tables["gen/full"].costs.hint.resident_bytes == TORCH_RESIDENT
        assert engine.scheduler.memory[index].used == ENGINE_RESIDENT
        assert engine.models["slotted:0"].resident("gen/full")
