"""The resource-true device model: devices name the physical compute and memory they draw on,
and devices that name the same resource share its capacity in placement, batching limits and
memory (runtimes over one host CPU split its cores; they do not each get a batch in flight)."""

from __future__ import annotations

from typing import Any

import pytest

from hetero.framework.devices import DeviceClass, DeviceSpec
from hetero.framework.policy import load_policy_text
from hetero.framework.scheduler import Dispatch, Scheduler, StageTask, VirtualClock
from hetero.framework.scheduler.memory import MemoryManager, share_memory
from hetero.framework.scheduler.request_admission import RequestAdmission
from hetero.framework.topology import Topology

POLICY = """\
version: 1
stages:
  embed:
    modality: text
    variants:
      full: {flops_per_item: 10 GFLOPS, bytes_per_item: 1 MB, resident_bytes: 1 MB,
             max_batch: 2}
scheduler: {memory_reserve_fraction: 0.0}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 1000}}
"""


def _device(
    local: str,
    host: str = "box",
    *,
    device_class: DeviceClass = DeviceClass.CPU,
    flops: float = 1e11,
    memory: int = 1 << 30,
    **properties: Any,
) -> DeviceSpec:
    return DeviceSpec(
        id=f"npu:{local}",
        device_class=device_class,
        vendor_name="host CPU",
        backend="npu",
        host=host,
        memory_bytes=memory,
        peak_flops={"fp32": flops},
        memory_bandwidth_bytes_per_s=1e10,
        properties=properties,
    )


def test_runtime_views_of_a_host_cpu_name_its_cores_and_memory() -> None:
    ort = _device("onnxruntime/CPU", shares_host_memory=True)
    ov = _device("openvino/CPU", shares_host_memory=True)
    assert ort.resources == ov.resources == ("box/cpu", "box/memory")
    # An NPU on host memory computes on its own silicon but draws on the same memory.
    npu = _device("openvino/NPU", device_class=DeviceClass.NPU, shares_host_memory=True)
    assert npu.resources == ("box/npu:openvino/NPU", "box/memory")
    # A device with memory of its own draws on itself only; a mirror on what it serves.
    alone = _device("alone/CPU")
    assert alone.resources == ("box/npu:alone/CPU", "box/npu:alone/CPU")
    mirror = _device("mirror/CPU", serves="npu:alone/CPU")
    assert mirror.resources == alone.resources
    # A simulated fleet may name them outright.
    named = _device("igpu/0", resources={"compute": "box/igpu", "memory": "box/memory"})
    assert (named.compute_id, named.memory_id) == ("box/igpu", "box/memory")


def _scheduler(hosts: tuple[str, str]) -> Scheduler:
    devices = [
        _device("fast/CPU", hosts[0], flops=2e11, shares_host_memory=True),
        _device("slow/CPU", hosts[1], flops=1e11, shares_host_memory=True),
    ]
    policy = load_policy_text(POLICY, "cpu.yaml")
    return Scheduler(policy, devices, Topology(devices), VirtualClock())


def _task() -> StageTask:
    return StageTask("r", "embed", "embed", "full", "standard", arrival=0.0, deadline=1.0)


def _dispatch_all(scheduler: Scheduler, count: int) -> list[Dispatch]:
    for _ in range(count):
        scheduler.enqueue(_task())
    placed = []
    while isinstance(outcome := scheduler.dispatch(), Dispatch):
        placed.append(outcome)
    return placed


def test_runtimes_of_one_cpu_hold_one_batch_of_a_model_between_them() -> None:
    scheduler = _scheduler(("box", "box"))
    placed = _dispatch_all(scheduler, 5)
    # max_batch 2: the CPU's one batch goes to the faster runtime; the slower one stays
    # idle rather than running a second batch on the same two cores.
    assert [d.device_id for d in placed] == ["npu:fast/CPU", "npu:fast/CPU"]
    assert scheduler.queued("embed") == 3
    scheduler.completed(placed[0], ok=True, run_s=0.01, batch_size=2)
    (after,) = _dispatch_all(scheduler, 0)
    assert after.device_id == "npu:fast/CPU"


def test_the_control_runtimes_on_two_hosts_each_take_a_batch() -> None:
    scheduler = _scheduler(("box-a", "box-b"))
    placed = _dispatch_all(scheduler, 5)
    assert sorted(d.device_id for d in placed) == ["npu:fast/CPU"] * 2 + ["npu:slow/CPU"] * 2
    assert scheduler.queued("embed") == 1


def test_runtimes_of_one_host_share_one_memory_budget() -> None:
    shared = _scheduler(("box", "box"))
    first, second = shared.memory
    assert first.shared is not None and first.shared is second.shared
    assert first.shared.capacity == 1 << 30  # one host's memory, not two
    apart = _scheduler(("box-a", "box-b"))
    assert [m.shared for m in apart.memory] == [None, None]


def test_admission_counts_a_compute_resource_once() -> None:
    # Both runtimes over one host's cores are one server: a queue drains one run at a time.
    one = _scheduler(("box", "box"))
    assert RequestAdmission(one.policy, one).run_slots("embed") == 1
    # The control: the same devices on two hosts drain two at once.
    apart = _scheduler(("box-a", "box-b"))
    assert RequestAdmission(apart.policy, apart).run_slots("embed") == 2


def _calibrated(hosts: tuple[str, str]) -> Scheduler:
    devices = [
        _device("fast/CPU", hosts[0], shares_host_memory=True),
        _device("slow/CPU", hosts[1], shares_host_memory=True),
    ]
    scheduler = Scheduler(
        load_policy_text(POLICY, "cpu.yaml"), devices, Topology(devices), VirtualClock()
    )
    scheduler.calibrate("embed", "npu:fast/CPU", 0.05)  # measured side by side at warm-up
    scheduler.calibrate("embed", "npu:slow/CPU", 0.06)
    return scheduler


def _after_loaded_runs(scheduler: Scheduler) -> set[str]:
    """Every run measures four times the faster runtime's warm-up time (other models beside
    it): where do the tasks go?"""
    used = set()
    for _ in range(20):
        (placed,) = _dispatch_all(scheduler, 1)
        used.add(placed.device_id)
        scheduler.completed(placed, ok=True, run_s=0.2, batch_size=1)
    return used


def test_a_slowdown_measured_on_shared_cores_moves_every_runtime_there() -> None:
    scheduler = _calibrated(("box", "box"))
    assert _after_loaded_runs(scheduler) == {"npu:fast/CPU"}
    fast, slow = scheduler.tables["embed/full"].correction
    assert slow / fast == pytest.approx(0.06 / 0.05)  # warm-up's ranking kept, level moved
    # The control: on its own host the idle device keeps its solo figure, and takes work.
    apart = _calibrated(("box-a", "box-b"))
    assert _after_loaded_runs(apart) == {"npu:fast/CPU", "npu:slow/CPU"}


def test_a_runtime_with_its_own_budget_keeps_it_inside_the_shared_host_memory() -> None:
    managers = [MemoryManager("npu:onnxruntime/CPU", 100), MemoryManager("npu:torch/cpu", 1000)]
    share_memory(managers, ["box/memory", "box/memory"])
    ort, torch = managers
    assert ort.shared is torch.shared is not None and ort.shared.capacity == 1000
    torch.kv_reserved = 950
    assert (ort.free, torch.free) == (50, 50)  # the host's memory is one
    torch.kv_reserved = 0
    assert (ort.free, torch.free) == (100, 1000)  # the override caps its runtime only
