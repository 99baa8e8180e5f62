"""One physical device is one memory budget however many runtimes expose it: a simulated GPU
seen as ``sim:gpu-0`` and as a vLLM mirror of it (``serves: sim:gpu-0``, as the vllm backend
names the ``cuda:N`` it mirrors) never holds more than the GPU's memory between the two.

Two stages of 45 GB each, on an 80 GB GPU: they cannot both be resident on it. The control
runs the same fleet with the mirror not saying what it serves (two budgets): the scheduler
then puts one model on each and the GPU would hold 90 GB, so the test can fail.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hetero.framework.devices import DeviceSpec
from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.scheduler.memory import MemoryManager, share_memory
from hetero.framework.simulator import load_workload
from hetero.framework.simulator.run import _Simulation
from hetero.framework.topology import Topology

POLICY = """\
version: 1
devices:
  simulated:
    - {name: gpu, preset: H100-SXM5-80GB, count: 1, host: a}
stages:
  enc:
    modality: image
    variants:
      full: {flops_per_item: 400 GFLOPS, bytes_per_item: 1 GB, resident_bytes: 45 GB,
             output_bytes: 1 MB, max_batch: 8, dtype: fp16}
  llm:
    modality: text
    variants:
      full: {flops_per_item: 2 TFLOPS, bytes_per_item: 10 GB, resident_bytes: 45 GB,
             max_batch: 8, dtype: fp16}
pipelines:
  ask: {steps: [{stage: enc}, {stage: llm}]}
routes: {/ask: ask, /chat: llm}
scheduler: {memory_reserve_fraction: 0.0}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t, queue_bound: 50}}
sla_tiers: {t: {deadline_ms: 60000}}
"""
WORKLOAD = """\
name: mirrored
seed: 5
duration_s: 20
arrivals: {kind: poisson, rate_per_s: 2}
mix:
  - {route: /ask, weight: 1, images: 1, image_pixels: 112896, text_tokens: 200, output_tokens: 50}
  - {route: /chat, weight: 1, text_tokens: 200, output_tokens: 50}
"""
GPU = "sim:gpu-0"
MIRROR = "sim:vllm-gpu-0"


class _Watched(_Simulation):
    """Records, at every event, the most memory the GPU's two devices held together."""

    peak = 0

    def _observe_memory(self, when: float) -> None:
        super()._observe_memory(when)
        held = sum(manager.used for manager in self.scheduler.memory)
        _Watched.peak = max(_Watched.peak, held)


def run(tmp_path: Path, serves: bool) -> tuple[int, int, dict[str, int]]:
    """(peak bytes held on the GPU, its memory, loads per device) of one simulated run."""
    policy = load_policy_text(POLICY, "mirrored.yaml")
    (gpu,) = resolve_fleet(policy, Registry(use_entry_points=False)).devices
    properties = {**gpu.properties, "runtime": "vllm"}
    if serves:
        properties["serves"] = GPU
    mirror = dataclasses.replace(gpu, id=MIRROR, properties=properties)
    devices: list[DeviceSpec] = [gpu, mirror]
    path = tmp_path / "workload.yaml"
    path.write_text(WORKLOAD)
    _Watched.peak = 0
    simulation = _Watched(
        policy, devices, Topology(devices), load_workload(path), "cost_model", "cost_aware"
    )
    metrics = simulation.run()
    assert metrics.summary()["completed"] > 0
    loads = {m.device_id: m.loads for m in simulation.scheduler.memory}
    return _Watched.peak, gpu.memory_bytes, loads


def test_a_gpu_and_its_vllm_mirror_never_hold_more_than_the_gpu_s_memory(
    tmp_path: Path,
) -> None:
    peak, memory, loads = run(tmp_path, serves=True)
    assert 45e9 <= peak <= memory  # one 45 GB model at a time on the 80 GB GPU
    assert sum(loads.values()) >= 2  # the scheduler did place models (and swap them)


def test_control_without_serves_the_two_devices_hold_more_than_the_gpu(tmp_path: Path) -> None:
    peak, memory, loads = run(tmp_path, serves=False)
    assert peak > memory  # two budgets: 90 GB "on" the 80 GB GPU
    assert loads[GPU] and loads[MIRROR]


def test_share_memory_groups_by_physical_id_and_leaves_single_devices_alone() -> None:
    managers = [MemoryManager(name, 100) for name in ("cuda:0", "vllm:cuda:0", "cuda:1")]
    share_memory(managers, ["h/cuda:0", "h/cuda:0", "h/cuda:1"])
    gpu, mirror, other = managers
    assert gpu.shared is mirror.shared is not None and other.shared is None
    mirror.kv_reserved = 70
    assert (gpu.free, mirror.free, other.free) == (30, 30, 100)
    assert gpu.plan("model", 40, now=0.0) is None  # 40 bytes do not fit beside the mirror's 70
