"""Continuous batching of LLM stages on the simulated devices (``scheduler.batching.llm:
continuous``, as vLLM-style engines do): a dispatch to an LLM model joins that device's engine
(:mod:`decode`), which admits it at the next decode step boundary, runs its prefill, then
decodes it with whatever else is running until its last token. The device is one serial
resource: another model's ready batch, or a request that can join, cuts the engine's decode
window at the end of the step in progress."""

from __future__ import annotations

import numpy as np

from hetero.backends.sim.timing import modelled_prefill, modelled_steps
from hetero.framework.scheduler import Dispatch
from hetero.framework.simulator.decode import DecodeEngine, DecodeSequence, EngineWork
from hetero.framework.simulator.run_devices import DevicesMixin
from hetero.framework.simulator.run_state import ENGINE_DONE, _DeviceSim

__all__ = ["DecodeMixin"]


class DecodeMixin(DevicesMixin):
    """The devices' continuous-batching engines: their sequences, KV budget, steps and ends."""

    def _engine(self, device: _DeviceSim, key: str) -> DecodeEngine[Dispatch]:
        """The device's engine for LLM model ``key`` (made on its first dispatch)."""
        engine = device.engines.get(key)
        if engine is None:
            tables = self.scheduler.tables[key]
            hint = tables.costs.hint
            spec = self.workload.spec
            nominal = spec.stage_nominal.get(tables.costs.stage, spec.nominal).text_tokens
            index = self.order[device.spec.id]
            engine = DecodeEngine(
                max_running=int(tables.limit[index]),
                block_tokens=self.kv.block_tokens,
                bytes_per_token=hint.kv_bytes_per_token,
                prefill_s=lambda prompts: modelled_prefill(hint, device.spec, prompts, nominal),
                steps_s=lambda contexts, remaining: modelled_steps(
                    hint, device.spec, contexts, remaining, nominal
                ),
            )
            device.engines[key] = engine
        return engine

    def _sequence(self, dispatch: Dispatch) -> DecodeSequence[Dispatch]:
        """The engine's view of a dispatched LLM task: its prompt and output length."""
        run = self.runs.get(int(dispatch.task.request_id))
        if run is None:  # dropped meanwhile: a nominal prompt, nothing to generate
            spec = self.workload.spec
            nominal = spec.stage_nominal.get(dispatch.task.stage, spec.nominal).text_tokens
            return DecodeSequence(dispatch, int(nominal), 0)
        return DecodeSequence(dispatch, run.request.text_tokens, run.request.output_tokens)

    def _kv_budget_blocks(self, device: _DeviceSim, key: str, now: float) -> int:
        """Blocks of KV cache engine ``key`` may hold on the device: its memory after the
        resident models and the other engines' blocks."""
        manager = self.scheduler.memory[self.order[device.spec.id]]
        free = float(manager.capacity - manager.model_bytes)
        block = self.kv.block_tokens
        for other, engine in device.engines.items():
            if other != key:
                free -= (
                    float(np.ceil(engine.tokens(now) / block).sum())
                    * block
                    * (engine.bytes_per_token)
                )
        engine = device.engines[key]
        return max(0, int(free // (block * engine.bytes_per_token)))

    def _start_engine(self, device: _DeviceSim, now: float) -> bool:
        """An idle device runs its engines' next work (the first engine, by key, that has
        any); False when none has."""
        for key in sorted(device.engines):
            engine = device.engines[key]
            if not engine.has_work:
                continue
            work = engine.next_work(now, self._kv_budget_blocks(device, key, now))
            if work is None:
                continue
            if work.kind == "prefill":
                self._prefill_starts(device, key, work, now)
            device.busy = True
            device.engine_key = key
            self.push(work.end, ENGINE_DONE, (device.spec.id, key, engine.generation))
            return True
        return False

    def _prefill_starts(
        self, device: _DeviceSim, key: str, work: EngineWork[Dispatch], now: float
    ) -> None:
        """A prefill step starts: the model's load (if it is not on the device yet) and the
        joining requests' inputs come first; their waits and first tokens are counted."""
        index = self.scheduler.fleet.index[device.spec.id]
        delay = self._before_run_s(device, key, index, [s.item for s in work.joining])
        work.ends = work.ends + delay
        for sequence in work.joining:
            sequence.before_run_s += delay
        warmup_s = self.workload.spec.warmup_s
        for sequence in work.joining:
            if sequence.admitted_at != now or sequence.generated:
                continue  # readmitted after a preemption: counted the first time
            task = sequence.item.task
            if task.qos_class == self.lowest_class and task.arrival >= warmup_s:
                self.metrics.lowest_class_waits.append(now - task.enqueued_at)
            run = self.runs.get(int(task.request_id))
            if run is not None and run.request.arrival >= warmup_s and sequence.output:
                self.metrics.ttft.append(work.end - run.request.arrival)

    def _cut_window(self, device: _DeviceSim, now: float) -> None:
        """Other work wants the device: end the running decode window at the next step."""
        assert device.engine_key is not None
        engine = device.engines[device.engine_key]
        wanted = any(e.wants_step_boundary() for e in device.engines.values()) or any(
            b.ready(now) for b in device.batchers.values()
        )
        if wanted and (end := engine.truncate(now)) is not None:
            self.push(end, ENGINE_DONE, (device.spec.id, device.engine_key, engine.generation))

    def _engine_done(self, device_id: str, key: str, generation: int) -> None:
        device = self.devices[device_id]
        engine = device.engines[key]
        work = engine.work
        if generation != engine.generation or work is None:
            return  # the window was cut: a later event ends it
        now = self.clock.now()
        self.metrics.busy[device_id].append((work.start, now - work.start))
        device.busy = False
        device.engine_key = None
        finished = engine.finish()
        if not engine.has_work:
            self.kv.remove(device_id, engine)
        for sequence in finished:
            # its time in the engine, less the loads and transfers before its prefills: what
            # the scheduler's correction and slow-call breaker judge is the device's running
            run_s = max(0.0, now - (sequence.admitted_at or now) - sequence.before_run_s)
            task = sequence.item.task
            variant = sequence.item.model_key.split("/", 1)[1]
            self.admission.observe(task.stage, variant, run_s, task.items, task.units)
            self._finish(sequence.item, device_id, run_s, max(1, round(sequence.mean_batch)))
