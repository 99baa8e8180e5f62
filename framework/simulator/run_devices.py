"""The simulated devices' runs and loads: a batch's modelled time (:func:`modelled_run`, the sim
backend's formula, scaled by the requests' sizes against the workload's nominal size; for an LLM
stage phase by phase, with its KV cache in paged blocks: :mod:`kv`), the model's load first when
it is not resident (the modelled time times a draw from Alibaba's measured spread), the inputs'
transfers, the warm-up's loads, a batch's completion, and the memory figures the devices'
resident models and KV caches give."""

from __future__ import annotations

import numpy as np

from hetero.backends.sim.calibration import load_multiplier
from hetero.backends.sim.timing import LlmSequences, RunTime, modelled_run
from hetero.framework.devices import DeviceSpec
from hetero.framework.graph import BandwidthHint
from hetero.framework.scheduler import Dispatch
from hetero.framework.simulator.kv import KvBatch
from hetero.framework.simulator.run_measures import MeasuresMixin
from hetero.framework.simulator.run_state import (
    BATCH_DONE,
    LOAD_DONE,
    WARMUP,
    _DeviceSim,
)

__all__ = ["DevicesMixin"]


class DevicesMixin(MeasuresMixin):
    """Runs and loads on the simulated devices, and the memory figures they give."""

    def _transfer_s(self, dispatch: Dispatch, dst: int) -> float:
        """Time to bring a task's inputs to device ``dst``: from the devices that hold them
        (topology routes), or from the host for a first step."""
        fleet = self.scheduler.fleet
        if not dispatch.task.inputs:
            hint = self.scheduler.tables[dispatch.model_key].costs.hint
            size = hint.input_bytes * self._scale(dispatch)
            return float(size * fleet.ingress_inverse_bandwidth[dst])
        total = 0.0
        for handle in dispatch.task.inputs:
            src = fleet.index[handle.device_id]
            if src != dst:
                latency, inverse_bandwidth = fleet.route(src, dst)
                total += latency + handle.size_bytes * inverse_bandwidth
        return total

    def _before_run_s(
        self, device: _DeviceSim, key: str, index: int, dispatches: list[Dispatch]
    ) -> float:
        """Seconds before a run on ``device`` can compute: the model's load if it is not
        there yet (it is from then on), then the inputs, which move in parallel (the slowest
        counts)."""
        delay = 0.0
        if key not in device.loaded:
            delay += self._load_s(key, index)
            device.loaded.add(key)
            if key in device.prefetch:
                device.prefetch.remove(key)
        return delay + max(self._transfer_s(d, index) for d in dispatches)

    def _start(self, device: _DeviceSim, key: str, batch: list[Dispatch]) -> None:
        tables = self.scheduler.tables[key]
        hint = tables.costs.hint
        index = self.scheduler.fleet.index[device.spec.id]
        duration = self._before_run_s(device, key, index, batch)
        now = self.clock.now()
        times, kv_batch = self._modelled_run(hint, device.spec, key, batch, now + duration)
        run_s = times.seconds  # the sim backend's formula (modelled_run), LLM or not
        prefill_of = None
        if kv_batch is not None:
            prefill_of = duration + kv_batch.prefill_s
            self.kv.add(device.spec.id, kv_batch)
        duration += run_s
        for dispatch in batch:
            if (
                dispatch.task.qos_class == self.lowest_class
                and dispatch.task.arrival >= self.workload.spec.warmup_s
            ):
                self.metrics.lowest_class_waits.append(now - dispatch.task.enqueued_at)
            run = self.runs.get(int(dispatch.task.request_id))
            modality = self.modality[dispatch.task.stage]
            counted = run is not None and run.request.arrival >= self.workload.spec.warmup_s
            if run is not None and counted and modality == "text" and run.request.output_tokens:
                if prefill_of is None:
                    total = run.request.text_tokens + run.request.output_tokens
                    prefill = duration - run_s + run_s * run.request.text_tokens / max(total, 1)
                else:
                    prefill = prefill_of
                self.metrics.ttft.append(now + prefill - run.request.arrival)
        device.busy = True
        self.metrics.busy[device.spec.id].append((now, duration))
        self.push(now + duration, BATCH_DONE, (device.spec.id, batch, run_s, kv_batch))

    def _load_s(self, key: str, index: int) -> float:
        """One load: the modelled time times a draw from Alibaba's measured spread."""
        draw = load_multiplier(self.load_draws.random())
        return float(self.scheduler.tables[key].costs.load_s[index]) * draw

    def _warm_up(self, now: float) -> None:
        """A forecast bin closed: queue the warm-up's loads, forget what it released."""
        assert self.warmup is not None
        loads, released = self.warmup.tick(now)
        for load in loads:
            self.memory_moved.add(self.order[load.device_id])
            device = self.devices[load.device_id]
            for victim in load.plan.evict:
                device.loaded.discard(victim)
                if victim in device.prefetch:
                    device.prefetch.remove(victim)
            device.prefetch.append(load.plan.key)
        for device_id, key in released:
            self.memory_moved.add(self.order[device_id])
            self.devices[device_id].loaded.discard(key)
        if self.events:  # keep forecasting while anything is still to happen
            self.push(self.warmup.next_tick, WARMUP, None)

    def _start_prefetch(self, device: _DeviceSim) -> None:
        """An idle device with nothing ready runs a warm-up load (never ahead of work)."""
        index = self.scheduler.fleet.index[device.spec.id]
        while device.prefetch:
            key = device.prefetch.pop(0)
            if key in device.loaded or not self.scheduler.tables[key].resident[index]:
                continue
            duration = self._load_s(key, index)
            device.busy = True
            now = self.clock.now()
            self.metrics.busy[device.spec.id].append((now, duration))
            self.push(now + duration, LOAD_DONE, (device.spec.id, key))
            return

    def _load_done(self, device_id: str, key: str) -> None:
        device = self.devices[device_id]
        device.busy = False
        index = self.scheduler.fleet.index[device_id]
        if self.scheduler.tables[key].resident[index]:  # not evicted while it loaded
            device.loaded.add(key)

    def _modelled_run(
        self, hint: BandwidthHint, device: DeviceSpec, key: str, batch: list[Dispatch], start: float
    ) -> tuple[RunTime, KvBatch | None]:
        """The batch's modelled time (:func:`modelled_run`, the sim backend's formula) and, for
        an LLM stage (a stage with a KV cache), its phases and KV cache."""
        if not hint.kv_bytes_per_token:
            items = float(sum(self._scale(d) for d in batch))
            return modelled_run(hint, device, items), None
        stage = key.split("/", 1)[0]
        spec = self.workload.spec
        nominal = spec.stage_nominal.get(stage, spec.nominal).text_tokens
        prompts, outputs = [], []
        for dispatch in batch:
            run = self.runs.get(int(dispatch.task.request_id))
            request = run.request if run is not None else None
            prompts.append(request.text_tokens if request is not None else int(nominal))
            outputs.append(request.output_tokens if request is not None else 0)
        times = modelled_run(hint, device, len(batch), LlmSequences(prompts, outputs, nominal))
        return times, KvBatch(
            start=start,
            prefill_s=times.prefill_s,
            decode_s=times.decode_s,
            prompts=np.asarray(prompts, dtype=float),
            outputs=np.asarray(outputs, dtype=float),
            bytes_per_token=hint.kv_bytes_per_token,
        )

    def _batch_done(
        self, device_id: str, batch: list[Dispatch], run_s: float, kv_batch: KvBatch | None
    ) -> None:
        device = self.devices[device_id]
        device.busy = False
        if kv_batch is not None:
            self.kv.remove(device_id, kv_batch)
        first = batch[0]
        self.admission.observe(  # as the engine folds each batch it ran into the stage's pace
            first.task.stage,
            first.model_key.split("/", 1)[1],
            run_s,
            sum(d.task.items for d in batch) or 1,
            sum(d.task.units for d in batch),
        )
        for dispatch in batch:
            self._finish(dispatch, device_id, run_s, len(batch))

    def _observe_memory(self, when: float) -> None:
        if when < self.workload.spec.warmup_s:
            self.last_memory_time = when
            return
        dt = when - self.last_memory_time
        memory = self.scheduler.memory
        changed = self.last_used is None
        for index in self.memory_moved:
            model_bytes = float(memory[index].model_bytes)
            if model_bytes != self.model_bytes[index]:
                self.model_bytes[index] = model_bytes
                changed = True
        self.memory_moved.clear()
        kv: dict[int, float] = {}
        if self.kv.running:
            allocated_all = held_all = 0.0
            # Devices without a running batch add nothing: visit the others, in fleet order.
            running = sorted(self.order[d] for d, batches in self.kv.running.items() if batches)
            for index in running:
                allocated, held = self.kv.usage(self.device_ids[index], when)
                kv[index] = allocated
                allocated_all += allocated
                held_all += held
            self.metrics.observe_kv(allocated_all, held_all, dt)
        if changed or kv != self.last_kv:
            used = self.model_bytes.copy()
            for index, allocated in kv.items():
                used[index] += allocated
            self.last_figures = self.metrics.memory_figures(used / self.capacity)
            self.last_used, self.last_kv = used, kv
        self.metrics.observe_memory_figures(self.last_figures, dt)
        self.last_memory_time = when
