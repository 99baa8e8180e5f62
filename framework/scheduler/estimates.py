"""What the scheduler's cost tables say without placing anything: calibrated estimates, the
fastest device, run slots and batching of a stage (admission and the engine ask), and the
measurements that calibrate them (warm-up's probes, loads timed where they ran)."""

from __future__ import annotations

import numpy as np

from hetero.framework.scheduler.state import SchedulerState

__all__ = ["EstimatesMixin"]


class EstimatesMixin(SchedulerState):
    """Questions about a stage's costs on the fleet, and the measurements that set them."""

    def calibrate(self, stage: str, device_id: str, run_s: float, items: float = 1.0) -> None:
        """A measured run of ``items`` items of ``stage``'s full variant on ``device_id``
        (warm-up timing): every variant's estimate there is scaled to match it."""
        index = self.fleet.index[device_id]
        device = self.devices[index]
        full = self.tables[f"{stage}/full"].costs.hint
        modelled = full.batch_seconds(
            device.peak_flops_for(full.dtype), device.memory_bandwidth_bytes_per_s, items
        )
        if modelled <= 0 or run_s <= 0:
            return
        for key, tables in self.tables.items():
            if key.split("/", 1)[0] == stage:
                tables.correction[index] = run_s / modelled
                self._calibrated[(key, index)] = run_s / modelled  # drift is judged from it
                tables.refresh(index)

    def probe_spread(self, stage: str, device_id: str, spread: float) -> None:
        """Warm-up's timed runs of ``stage``'s probe on ``device_id`` were ``spread`` apart
        (slowest over fastest). Two runtimes of one compute resource whose figures differ by
        less than that were not told apart by the probes, so the one placement prefers is
        checked against the other in service (:mod:`~hetero.framework.scheduler.exploring`)."""
        if spread >= 1.0:
            self._probe_spread[(stage, self.fleet.index[device_id])] = spread

    def spread_of(self, stage: str, device_id: str) -> float:
        """The spread :meth:`probe_spread` was given for ``stage`` on ``device_id`` (1.0: none)."""
        return self._probe_spread.get((stage, self.fleet.index[device_id]), 1.0)

    def load_measured(self, model_key: str, device_id: str, seconds: float) -> None:
        """A load of ``model_key`` on ``device_id`` took ``seconds``, timed where it ran (a
        warm-up's, a lane's): the model's load estimate there from now on. The cost model's
        figure (a fixed set-up plus the bytes over the host link) is a guess; a CPU runtime's
        session set-up or compilation takes seconds."""
        tables = self.tables.get(model_key)
        if tables is None or seconds <= 0:
            return
        index = self.fleet.index[device_id]
        self._loads[(model_key, index)] = seconds
        tables.costs.load_s[index] = seconds
        tables.refresh(index)

    def estimate_s(self, stage: str, variant: str, device_id: str, items: int = 1) -> float:
        """The calibrated compute estimate of ``items`` items on ``device_id`` (idle device)."""
        tables = self.tables.get(f"{stage}/{variant}") or self.tables[f"{stage}/full"]
        index = self.fleet.index[device_id]
        return float(tables.costs.marginal_s[index, 0] * tables.correction[index] * items)

    def fastest_s(self, stage: str, variant: str = "full") -> float:
        """The calibrated compute estimate of one item on the fastest device that can run the
        stage variant (infinity when none can)."""
        tables = self.tables.get(f"{stage}/{variant}") or self.tables[f"{stage}/full"]
        fastest = tables.fastest_s  # kept until a device's unit time or health moves
        if fastest is None:
            runnable = tables.costs.runnable & self.healthy
            fastest = float(np.min(tables.unit_s, where=runnable, initial=np.inf))
            tables.fastest_s = fastest
        return fastest

    def runnable_devices(self, stage: str, variant: str = "full") -> list[str]:
        """Devices that could ever run this stage variant."""
        tables = self.tables.get(f"{stage}/{variant}") or self.tables[f"{stage}/full"]
        return [d.id for d, ok in zip(self.devices, tables.costs.runnable, strict=True) if ok]

    def batching_for(self, model_key: str) -> tuple[int, float]:
        """``(max_batch, max_delay_s)`` of a stage variant: its own figures, else the
        scheduler's default delay; 1 for a variant that is not batchable."""
        hint = self.tables[model_key].costs.hint
        stage_name, variant_name = model_key.split("/", 1)
        variants = self.policy.spec.stages[stage_name].variants
        variant = variants["light"] if variant_name == "light" else variants["full"]
        delay_ms = variant.max_delay_ms
        if delay_ms is None:
            delay_ms = self.policy.spec.scheduler.batching.max_delay_ms
        return (hint.max_batch if hint.batchable else 1), delay_ms / 1000.0

    def eligible_devices(self, stage: str, variant: str) -> int:
        """How many devices could ever run this stage variant (healthy or not)."""
        tables = self.tables.get(f"{stage}/{variant}") or self.tables[f"{stage}/full"]
        return int(tables.costs.runnable.sum())
