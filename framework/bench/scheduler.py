"""``hetero bench scheduler``: how long one scheduling decision (queue pop + placement) takes.

64 simulated devices (8 groups of 8 across A100, H100, H200, MI300X, Ascend and Xeon, one host
each) or, with ``--devices 1000``, 125 hosts of 8 of the same kinds, and 8 stages, with 100,
1,000 and 10,000 tasks queued. Each decision is timed around
``Scheduler.dispatch()``; the dispatched task is then completed and a new one queued, so the
queue length holds. Side by side in the same run: a naive reference that, per decision,
rescans and sorts every queued task by its current aged priority and costs every device in
Python (routing transfers through the topology each time), the approach of the design notes.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hetero.framework.fleet import simulated_devices
from hetero.framework.policy import Policy, load_policy_text
from hetero.framework.policy.hints import hint_from_variant
from hetero.framework.scheduler.clock import VirtualClock
from hetero.framework.scheduler.scheduler import Dispatch, Scheduler
from hetero.framework.scheduler.tasks import OutputHandle, StageTask
from hetero.framework.topology import Topology

__all__ = ["BenchResult", "bench_policy", "measure_decisions", "run_scheduler_bench"]

PRESETS = (
    "A100-SXM4-80GB",
    "H100-SXM5-80GB",
    "H200",
    "MI300X",
    "Ascend-910B",
    "H100-SXM5-80GB",
    "A100-SXM4-80GB",
    "Xeon-8480+",
)
QUEUE_LENGTHS = (100, 1_000, 10_000)
FLEET_SIZES = (64, 1_000)
CLASSES = ("interactive", "standard", "batch")


def bench_policy(devices: int = 64) -> Policy:
    """``devices`` (a multiple of 8) in hosts of 8, the kinds of :data:`PRESETS` taking
    turns by host, and 8 stages with small models so memory never blocks."""
    if devices < 8 or devices % 8:
        raise ValueError(f"the bench fleet is hosts of 8 devices, got {devices}")
    hosts = devices // 8
    kinds = len(PRESETS)
    groups = "\n".join(
        f"    - {{name: g{i}, preset: {preset}, count: 8, host: host-{i}, "
        f"hosts: {hosts // kinds + (i < hosts % kinds)}}}"
        for i, preset in enumerate(PRESETS)
        if hosts // kinds + (i < hosts % kinds)
    )
    stages = "\n".join(
        f"  s{i}:\n    modality: text\n    variants:\n"
        f"      full: {{flops_per_item: {1 + i} GFLOPS, "
        f"bytes_per_item: {10 + i} MB, resident_bytes: {50 + 10 * i} MB, input_bytes: 1 MB, "
        f"output_bytes: 1 MB, max_batch: 8}}"
        for i in range(8)
    )
    text = f"""version: 1
devices:
  simulated:
{groups}
stages:
{stages}
qos:
  default_class: standard
  classes:
    interactive: {{weight: 8, sla_tier: t, queue_bound: 100000}}
    standard: {{weight: 4, sla_tier: t, queue_bound: 100000}}
    batch: {{weight: 1, sla_tier: t, queue_bound: 100000}}
sla_tiers: {{t: {{deadline_ms: 1000}}}}
"""
    return load_policy_text(text, "builtin:bench/scheduler")


@dataclass(frozen=True, slots=True)
class BenchResult:
    """Decision latency at one queue length, for one implementation."""

    implementation: str
    queued: int
    decisions: int
    p50_us: float
    p99_us: float
    cpu_p50_us: float = 0.0
    cpu_p99_us: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "implementation": self.implementation,
            "queued": self.queued,
            "decisions": self.decisions,
            "p50_us": round(self.p50_us, 2),
            "p99_us": round(self.p99_us, 2),
            "cpu_p50_us": round(self.cpu_p50_us, 2),
            "cpu_p99_us": round(self.cpu_p99_us, 2),
        }


class NaiveScheduler:
    """The reference: rescan and sort everything, cost every device in Python, per decision."""

    def __init__(
        self, policy: Policy, devices: list[Any], topology: Topology, clock: VirtualClock
    ) -> None:
        self.policy = policy
        self.devices = devices
        self.topology = topology
        self.clock = clock
        self.tasks: list[StageTask] = []
        self.backlog = {d.id: 0.0 for d in devices}
        self.hints = {}
        for name, stage in policy.spec.stages.items():
            hint = hint_from_variant(stage.variants["full"])
            assert hint is not None, "the bench's policy gives every stage its figures"
            self.hints[f"{name}/full"] = hint
        self.weights = {n: c.weight for n, c in policy.spec.qos.classes.items()}

    def enqueue(self, task: StageTask) -> None:
        self.tasks.append(task)

    def dispatch(self) -> tuple[StageTask, str]:
        now = self.clock.now()
        aging = self.policy.spec.qos.aging_per_second
        self.tasks.sort(
            key=lambda t: self.weights[t.qos_class] + aging * (now - t.arrival), reverse=True
        )
        task = self.tasks.pop(0)
        hint = self.hints[f"{task.stage}/full"]
        costs = []
        for device in self.devices:
            compute = hint.roofline_seconds(
                device.peak_flops_for(hint.dtype), device.memory_bandwidth_bytes_per_s
            )
            transfer = sum(
                self.topology.transfer_time(h.size_bytes, h.device_id, device.id)
                for h in task.inputs
            )
            costs.append((self.backlog[device.id] + compute + transfer, device.id))
        costs.sort()
        return task, costs[0][1]


def _task(rng: random.Random, now: float, devices: list[str]) -> StageTask:
    stage = f"s{rng.randrange(8)}"
    source = OutputHandle(rng.choice(devices), None, 1 << 20)
    return StageTask(
        "bench",
        stage,
        stage,
        "full",
        rng.choice(CLASSES),
        arrival=now,
        deadline=now + 1,
        inputs=(source,),
    )


def _measure(
    name: str,
    queued: int,
    decisions: int,
    make: Callable[[VirtualClock], Any],
    step: Callable[[Any], None],
    ids: list[str],
) -> BenchResult:
    rng = random.Random(42)
    clock = VirtualClock()
    scheduler = make(clock)
    for _ in range(queued):
        clock.advance(1e-4)
        scheduler.enqueue(_task(rng, clock.now(), ids))
    samples = []
    cpu = []
    for _ in range(decisions):
        clock.advance(1e-4)
        cpu_started = time.thread_time_ns()
        started = time.perf_counter_ns()
        outcome = scheduler.dispatch()
        samples.append((time.perf_counter_ns() - started) / 1000.0)
        cpu.append((time.thread_time_ns() - cpu_started) / 1000.0)
        step((scheduler, outcome))
        scheduler.enqueue(_task(rng, clock.now(), ids))
    samples.sort()
    cpu.sort()
    return BenchResult(
        implementation=name,
        queued=queued,
        decisions=decisions,
        p50_us=statistics.median(samples),
        p99_us=samples[min(len(samples) - 1, int(0.99 * len(samples)))],
        cpu_p50_us=statistics.median(cpu),
        cpu_p99_us=cpu[min(len(cpu) - 1, int(0.99 * len(cpu)))],
    )


def _complete(pair: tuple[Scheduler, Any]) -> None:
    scheduler, outcome = pair
    if isinstance(outcome, Dispatch):
        scheduler.completed(outcome, ok=True, run_s=outcome.decision.compute_s)


def measure_decisions(
    policy: Policy,
    devices: list[Any],
    topology: Topology,
    queued: int,
    decisions: int,
    search: str | None = None,
) -> BenchResult:
    """hetero's decision latency with ``queued`` tasks waiting (``search``: the scheduler's
    placement search, None: its default for the fleet's size)."""
    return _measure(
        "hetero" if search is None else f"hetero-{search}",
        queued,
        decisions,
        lambda clock: Scheduler(policy, devices, topology, clock, search=search),
        _complete,
        [d.id for d in devices],
    )


def run_scheduler_bench(
    decisions: int = 3000, naive_decisions: int = 300, devices_count: int = 64
) -> list[BenchResult]:
    """hetero and the naive reference at every queue length, in one run."""
    policy = bench_policy(devices_count)
    devices = simulated_devices(policy.spec.devices.simulated)
    topology = Topology(devices)
    ids = [d.id for d in devices]

    results = []
    for queued in QUEUE_LENGTHS:
        results.append(measure_decisions(policy, devices, topology, queued, decisions))
        results.append(
            _measure(
                "naive",
                queued,
                naive_decisions,
                lambda clock: NaiveScheduler(policy, devices, topology, clock),
                lambda pair: None,
                ids,
            )
        )
    return results
