"""What a simulated run measures, and its summary per placement policy."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["RunMetrics"]


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


@dataclass
class RunMetrics:
    """Raw observations of one run; :meth:`summary` turns them into the reported figures."""

    policy: str
    latencies: list[float] = field(default_factory=list)
    latencies_by_class: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    deadlines: dict[str, float] = field(default_factory=dict)
    offered_by_class: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    warmup_s: float = 0.0
    ttft: list[float] = field(default_factory=list)
    lowest_class_waits: list[float] = field(default_factory=list)
    load_waits: int = 0
    """Tasks placed where their model was not loaded yet (they wait for a load)."""
    completed: int = 0
    shed: int = 0
    failed: int = 0
    loads: int = 0
    evictions: int = 0
    breaker_trips: int = 0
    preemptions: int = 0
    """Sequences a continuous batch preempted for want of KV blocks (recomputed later)."""
    first_arrival: float = 0.0
    last_completion: float = 0.0
    memory_std_integral: float = 0.0
    memory_mean_integral: float = 0.0
    observed_time: float = 0.0
    kv_allocated_integral: float = 0.0
    kv_waste_integral: float = 0.0
    busy: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    wall_s: float = 0.0
    cpu_s: float = 0.0
    """The simulating thread's CPU time (time.thread_time): what a busy machine does not inflate."""
    events: int = 0

    @staticmethod
    def memory_figures(utilisation: np.ndarray[Any, Any]) -> tuple[float, float] | None:
        """``(std dev, mean)`` of a per-device memory utilisation (0-1); None for no devices."""
        if not utilisation.size:
            return None
        return float(np.std(utilisation)), float(np.mean(utilisation))

    def observe_memory(self, utilisation: np.ndarray[Any, Any], dt: float) -> None:
        """Fold in ``dt`` seconds at this per-device memory utilisation (0-1)."""
        self.observe_memory_figures(self.memory_figures(utilisation), dt)

    def observe_memory_figures(self, figures: tuple[float, float] | None, dt: float) -> None:
        """Fold in ``dt`` seconds at a utilisation of these :meth:`memory_figures`."""
        if dt > 0 and figures is not None:
            std, mean = figures
            self.memory_std_integral += std * dt
            self.memory_mean_integral += mean * dt
            self.observed_time += dt

    def observe_kv(self, allocated: float, held: float, dt: float) -> None:
        """Fold in ``dt`` seconds of KV cache allocated in blocks, ``held`` of it by tokens."""
        if dt > 0:
            self.kv_allocated_integral += allocated * dt
            self.kv_waste_integral += (allocated - held) * dt

    def summary(self) -> dict[str, Any]:
        """The figures the issue asks for, per policy. Latency figures, attainment, loads and
        throughput cover requests arriving after the warm-up; figures with nothing to measure
        are None (JSON null)."""
        lat = self.latencies
        start = max(self.first_arrival, self.warmup_s)
        span = self.last_completion - start
        p50, p99 = _percentile(lat, 50), _percentile(lat, 99)
        # On time over offered: shed and failed requests count as misses.
        attainment = {
            qos: sum(v <= self.deadlines[qos] for v in self.latencies_by_class.get(qos, []))
            / offered
            for qos, offered in sorted(self.offered_by_class.items())
            if offered
        }
        classes = {
            qos: {
                "requests": offered,
                "mean_ms": float(np.mean(values)) * 1e3 if values else None,
                "p50_ms": _percentile(values, 50) * 1e3 if values else None,
                "p99_ms": _percentile(values, 99) * 1e3 if values else None,
                "slo_attainment": attainment[qos],
            }
            for qos, offered in sorted(self.offered_by_class.items())
            if offered
            for values in [self.latencies_by_class.get(qos, [])]
        }
        hours = span / 3600.0 if span > 0 else None
        measured = len(lat)
        figures = {
            "policy": self.policy,
            "completed": self.completed,
            "shed": self.shed,
            "failed": self.failed,
            "mean_ms": float(np.mean(lat)) * 1e3 if lat else float("nan"),
            "p50_ms": p50 * 1e3,
            "p95_ms": _percentile(lat, 95) * 1e3,
            "p99_ms": p99 * 1e3,
            "p99_minus_p50_ms": (p99 - p50) * 1e3,
            "ttft_p50_ms": _percentile(self.ttft, 50) * 1e3,
            "ttft_p99_ms": _percentile(self.ttft, 99) * 1e3,
            "slo_attainment": attainment,
            "classes": classes,
            "lowest_class_max_wait_s": max(self.lowest_class_waits, default=float("nan")),
            "memory_utilisation_std_pct": 100.0 * self.memory_std_integral / self.observed_time
            if self.observed_time
            else 0.0,
            "memory_utilisation_mean_pct": 100.0 * self.memory_mean_integral / self.observed_time
            if self.observed_time
            else 0.0,
            "kv_block_waste_pct": 100.0 * self.kv_waste_integral / self.kv_allocated_integral
            if self.kv_allocated_integral
            else None,
            "load_waits": self.load_waits,
            "model_loads": self.loads,
            "model_evictions": self.evictions,
            "loads_per_hour": self.loads / hours if hours else float("nan"),
            "breaker_trips": self.breaker_trips,
            "kv_preemptions": self.preemptions,
            "throughput_rps": measured / span if span > 0 else float("nan"),
            "simulated_s": self.last_completion,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "events": self.events,
        }
        return {k: None if isinstance(v, float) and np.isnan(v) else v for k, v in figures.items()}
