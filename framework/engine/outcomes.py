"""What happens when a step's batch returns: the output kept where it was made, the next steps
queued, a device fault retried on another device (its breaker told), lost inputs made again,
and the request's future settled with its answered outputs (masked for the caller's role)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hetero.framework.engine.lanes import (
    BatchOutcome,
)
from hetero.framework.engine.requests import EngineResult, RequestState, StepTrace, settle
from hetero.framework.errors import (
    InputLostError,
    NoEligibleDeviceError,
    ShedError,
)
from hetero.framework.scheduler import (
    BreakerState,
    OutputHandle,
    StageTask,
)
from hetero.framework.sizes import nbytes_of

if TYPE_CHECKING:
    from hetero.framework.engine.engine import Engine

__all__ = ["Outcomes"]

logger = logging.getLogger(__name__)
# How often one request may have its steps made again because their kept outputs were lost
# (their node left, their keeper dropped them for room); past it the request fails with the
# last loss rather than loop while a cluster keeps losing its work.
MAX_INPUT_REDOS = 3


class Outcomes:
    """Settles steps and requests as batches finish."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def finish(self, outcome: BatchOutcome) -> None:
        dispatch = outcome.dispatch
        task = dispatch.task
        device_id = dispatch.device_id
        with self.engine._lock:
            self.engine.admission.finished(task)
        if outcome.skipped:
            with self.engine._lock:
                self.engine.scheduler.completed(dispatch, ok=True, run_s=0.0, judge=False)
            return
        device_fault = outcome.error is not None and outcome.blame
        self.engine.metrics.queue_wait.labels(task.stage, task.qos_class).observe(
            max(0.0, outcome.started_at - task.enqueued_at)
        )
        with self.engine._lock:
            if device_fault and not self.engine.models[device_id].resident(dispatch.model_key):
                self.engine.scheduler.unloaded(device_id, dispatch.model_key)  # its load failed
            self.engine.scheduler.completed(
                dispatch,
                ok=not device_fault,
                run_s=outcome.run_s if not device_fault else 0.0,
                batch_size=outcome.batch_size,
                judge=not isinstance(outcome.error, InputLostError),  # nothing ran to judge
                load_s=outcome.load_s,
            )
            breaker = self.engine.scheduler.breaker(task.stage, device_id)
            self.engine.metrics.breaker_state.labels(task.stage, device_id).set(
                0 if breaker.state is BreakerState.CLOSED else 1
            )
            state = self.engine._requests.get(task.request_id)
            if state is None:
                return  # cancelled or timed out meanwhile
            state.live_tasks.pop(task.id, None)
            offered = None
            key = state.keys.get(task.step)
            error: BaseException | None = None
            if outcome.error is None:
                offered = (
                    None if key is not None else self.engine.runner.step_inputs(state, task.step)
                )
                output = OutputHandle(device_id, outcome.output, nbytes_of(outcome.output))
                done = self.engine.runner.walk.record(state, task, output)
                state.devices[task.step] = device_id
                state.steps.append(step_trace(outcome))
                generated = _generated_tokens(outcome.output)
                if generated:  # a generation's length and time, for placing the next ones
                    lengths = self.engine.scheduler.output_lengths
                    lengths.observe(task.stage, generated)
                    lengths.times.finished(task.id, self.engine.clock.now())
                error = None if done else self.continue_(state)
            elif isinstance(outcome.error, InputLostError):
                error = self._redo_inputs(state, task, outcome.error)
            elif device_fault:
                error = self._retry(state, task, device_id, outcome.error)
            else:
                error = outcome.error  # the item itself was bad: no other device would help
            finished = error is not None or state.done()
            if error is not None:
                self.engine.runner.end(state)  # a done one ends in answer(), once fetched
        if offered is not None or (key is not None and outcome.error is None):
            self.engine.fills.offer(
                task, offered, outcome.output, key
            )  # outside the lock: it does I/O
        if not finished:
            return
        self.answer(state, error)

    def answer(self, state: RequestState, error: BaseException | None) -> None:
        """Settle a finished request's future: its error, or its outputs fetched."""
        if error is None:
            try:
                result = self.result(state)
            except InputLostError as err:  # its keeper died or dropped it: made again
                with self.engine._lock:
                    error = self._redo_final(state, err)
                if error is None:
                    return
            except Exception as err:  # a final output that could not be fetched: the
                # request fails with that, the lane lives on
                logger.warning("request %s: outputs not fetched: %s", state.request_id, err)
                error = err
        with self.engine._lock:
            self.engine.runner.end(state)
        if error is not None:
            self.engine.metrics.outcomes.labels(state.route, "failed").inc()
            settle(state.future, error=error)
            return
        self.engine.metrics.outcomes.labels(state.route, "ok").inc()
        settle(state.future, result=result)

    def result(self, state: RequestState) -> EngineResult:
        stages = self.engine.policy.stages
        had_light = any(
            "light" in stages[stage].variants for stage in state.pipeline.stage_of.values()
        )
        answer = state.answer if state.answer is not None else state.pipeline.sinks
        return EngineResult(
            request_id=state.request_id,
            outputs={step: self._answered(state, step) for step in answer},
            devices=dict(state.devices),
            degraded=(state.variant == "light" and had_light)
            or any(v == "light" for v in state.variants.values()),
            latency_s=self.engine.clock.now() - state.arrival,
            variant=state.variant,
            steps=tuple(state.steps),
            cached=dict(state.cached),
            variants=dict(state.variants),
            reasons=dict(state.reasons),
            model_versions={
                step: stages[stage].model_version for step, stage in state.pipeline.stage_of.items()
            },
        )

    def _answered(self, state: RequestState, step: str) -> Any:
        """A step's output fetched to the caller, masked for the caller's role where its
        stage touches a partition."""
        value = self.engine._fetched(state.outputs[step].value)
        stage = state.pipeline.stage_of[step]
        if self.engine.gate is not None and self.engine.policy.stages[stage].partition is not None:
            return self.engine.gate.mask(state.principal, stage, value)
        return value

    def continue_(self, state: RequestState) -> BaseException | None:
        """Queue the steps a finished one unblocked (lock held); an error if shed, or if
        composing a step's input from its dependencies' outputs refused them (the caller's
        error, e.g. a prompt over the limit: it ends the request, not the lane)."""
        try:
            self.engine.runner.enqueue_ready(state)
        except Exception as err:
            return err
        return None

    def _retry(
        self, state: RequestState, task: StageTask, device_id: str, error: BaseException | None
    ) -> BaseException | None:
        """Send a failed task to another device (lock held); an error if none is left."""
        problem = f"{type(error).__name__}: {error}"
        self.engine.metrics.failures.labels(task.stage, device_id).inc()
        logger.warning("%s: %s failed on %s: %s", task.request_id, task.step, device_id, problem)
        task.excluded = task.excluded | {device_id}
        task.failures = {**task.failures, device_id: problem}
        if len(task.excluded) >= self.engine.scheduler.eligible_devices(task.stage, task.variant):
            reasons = {d: f"failed this request ({p})" for d, p in task.failures.items()}
            return NoEligibleDeviceError(task.stage, reasons)
        self.engine.metrics.retries.labels(task.stage).inc()
        task.enqueued_at = self.engine.clock.now()
        try:
            self.engine.scheduler.enqueue(task)
        except ShedError as err:
            return err
        state.live_tasks[task.id] = task
        return None

    def _redo_inputs(
        self, state: RequestState, task: StageTask, error: InputLostError
    ) -> BaseException | None:
        """Run again the steps whose outputs ``task`` could not read (lock held): they were
        kept on a node that left. The task itself is queued again once they are done."""
        gone = set(error.devices)
        after = state.pipeline.after_of[task.step]
        redoing = [dep for dep in after if dep not in state.outputs]  # a sibling's loss did it
        lost = [
            dep
            for dep in after
            if dep in state.outputs
            and (
                state.outputs[dep].device_id in gone
                or not self._healthy(state.outputs[dep].device_id)
            )
        ]
        if not lost:  # nothing to redo: the request goes on once a sibling's redo is done,
            return self.continue_(state) if redoing else error  # or it cannot go on
        if state.redos >= MAX_INPUT_REDOS:
            logger.warning(
                "%s: %s lost its inputs again (%s) after %d redos: failing it",
                task.request_id,
                task.step,
                error.reason,
                state.redos,
            )
            return error
        state.redos += 1
        logger.warning(
            "%s: %s lost its inputs (%s): redoing %s",
            task.request_id,
            task.step,
            error.reason,
            lost,
        )
        self.engine.metrics.retries.labels(task.stage).inc()
        for dep in lost:
            del state.outputs[dep]
            state.devices.pop(dep, None)
        return self.continue_(state)

    def _redo_final(self, state: RequestState, error: InputLostError) -> BaseException | None:
        """Run again the answered steps whose outputs could not be fetched (lock held): their
        keeper (a node, a device actor) is gone or dropped them; as for lost inputs, at most
        :data:`MAX_INPUT_REDOS` times per request."""
        if self.engine._requests.get(state.request_id) is not state:
            return error  # cancelled or timed out meanwhile
        answer = state.answer if state.answer is not None else state.pipeline.sinks
        gone = set(error.devices)
        lost = [
            step
            for step in answer
            if step in state.outputs
            and (
                state.outputs[step].device_id in gone
                or not self._healthy(state.outputs[step].device_id)
            )
        ]
        if not lost or state.redos >= MAX_INPUT_REDOS:
            logger.warning("request %s: outputs not fetched: %s", state.request_id, error)
            return error
        state.redos += 1
        logger.warning(
            "%s: its outputs of %s were lost (%s): redoing them",
            state.request_id,
            lost,
            error.reason,
        )
        for step in lost:
            self.engine.metrics.retries.labels(state.pipeline.stage_of[step]).inc()
            del state.outputs[step]
            state.devices.pop(step, None)
        return self.continue_(state)

    def _healthy(self, device_id: str) -> bool:
        index = self.engine.scheduler.fleet.index.get(device_id)
        return index is None or bool(self.engine.scheduler.healthy[index])

    def fail(self, request_id: str, error: BaseException) -> None:
        with self.engine._lock:
            state = self.engine._requests.get(request_id)
            if state is None:
                return
            self.engine.runner.end(state)
        self.engine.metrics.outcomes.labels(state.route, "failed").inc()
        settle(state.future, error=error)


def _generated_tokens(output: Any) -> int:
    """The tokens a generation produced (its result's ``completion_tokens``; 0 for any other
    output, or one kept on a remote node)."""
    if isinstance(output, dict):
        tokens = output.get("completion_tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            return tokens
    return 0


def step_trace(outcome: BatchOutcome) -> StepTrace:
    """How a step ran, for its trace."""
    dispatch = outcome.dispatch
    task = dispatch.task
    return StepTrace(
        step=task.step,
        stage=task.stage,
        device=dispatch.device_id,
        variant=task.variant,
        queued_at=task.enqueued_at,
        started_at=outcome.started_at,
        load_s=outcome.load_s,
        run_s=outcome.run_s,
        batch_size=outcome.batch_size,
        estimate_s=dispatch.estimate_s,
        loaded=dispatch.load.load,
    )
