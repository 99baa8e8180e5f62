"""Facts about the host CPU and memory, from psutil, /proc and /sys.

The peak FLOP/s figure is the textbook one: physical cores x clock x FLOPs per cycle, where the
FLOPs per cycle follow the widest fused multiply-add the CPU advertises. Sources: Intel's and
AMD's optimisation manuals (two 256-bit FMA pipes per core give 32 fp32 FLOP/cycle on AVX2 parts;
AVX-512 on Zen 4 is double-pumped 256-bit, so the same 32; server Intel parts with two 512-bit
FMA units reach 64, which this conservative table does not assume). bf16 doubles fp32 where
``avx512_bf16`` is present, VNNI quadruples it for int8. Memory bandwidth is measured, not
guessed: the best of a few large ``numpy`` copies (read + write bytes over time).
"""

from __future__ import annotations

import functools
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

__all__ = ["HostFacts", "host_facts"]

_DEFAULT_GHZ = 2.0
_COPY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What the host CPU can do, in the units DeviceSpec wants."""

    hostname: str
    physical_cores: int
    logical_cores: int
    clock_ghz: float
    cpu_flags: frozenset[str]
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    numa_nodes: int

    @property
    def peak_flops(self) -> dict[str, float]:
        """Peak FLOP/s per dtype, from cores, clock and vector width."""
        per_cycle = (
            32.0 if {"avx2", "fma"} <= self.cpu_flags or "avx512f" in self.cpu_flags else 8.0
        )
        fp32 = self.physical_cores * self.clock_ghz * 1e9 * per_cycle
        flops = {"fp32": fp32, "fp16": fp32}
        flops["bf16"] = fp32 * 2 if "avx512_bf16" in self.cpu_flags else fp32
        flops["int8"] = fp32 * 4 if "avx512_vnni" in self.cpu_flags else fp32 * 2
        return flops


def _cpuinfo() -> tuple[frozenset[str], float | None]:
    flags: frozenset[str] = frozenset()
    mhz: float | None = None
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return flags, mhz
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = frozenset(value.split())
        elif key == "cpu MHz" and mhz is None:
            try:
                mhz = float(value)
            except ValueError:
                mhz = None
    return flags, mhz


def _clock_ghz(cpuinfo_mhz: float | None) -> float:
    freq = psutil.cpu_freq()
    if freq is not None and freq.max > 0:
        return float(freq.max) / 1000.0
    if freq is not None and freq.current > 0:
        return float(freq.current) / 1000.0
    return cpuinfo_mhz / 1000.0 if cpuinfo_mhz else _DEFAULT_GHZ


def _numa_nodes() -> int:
    nodes = Path("/sys/devices/system/node")
    try:
        return max(1, sum(1 for p in nodes.iterdir() if p.name.startswith("node")))
    except OSError:
        return 1


def _measure_bandwidth() -> float:
    src = np.ones(_COPY_BYTES // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - started)
    return 2 * _COPY_BYTES / max(best, 1e-9)


@functools.cache
def host_facts() -> HostFacts:
    """The host's facts, measured once per process."""
    flags, mhz = _cpuinfo()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    return HostFacts(
        hostname=socket.gethostname(),
        physical_cores=psutil.cpu_count(logical=False) or logical,
        logical_cores=logical,
        clock_ghz=_clock_ghz(mhz),
        cpu_flags=flags,
        memory_bytes=psutil.virtual_memory().total,
        memory_bandwidth_bytes_per_s=_measure_bandwidth(),
        numa_nodes=_numa_nodes(),
    )
