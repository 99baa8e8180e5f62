"""A request's walk through admission and the scheduler: the one orchestration the engine's
:class:`~hetero.framework.engine.graph_runner.GraphRunner` and the simulator both run.

The walk does what does not depend on where a step runs or on what it computes:

- admission of each stage the request uses, once for all of that stage's steps (their items
  together, the heaviest profile, a generation's sequence judged where it would finish);
- the principal's fair share of each admitted stage, held while the request lives;
- a :class:`~hetero.framework.scheduler.StageTask` for each step whose inputs are ready (its
  deadline, size, complexity, expected output and KV cache), queued in the scheduler;
- a finished step's output recorded, and the end of the request (shares given back, its
  queued steps dropped).

Around it the engine adds what only a server has (access checks, the feature cache, model
versions, futures, metrics), and the simulator its virtual devices and clock. So the admission
`hetero tune` tunes and the tasks the simulator places are the server's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from hetero.framework.engine.request_graph import GraphNode
from hetero.framework.engine.requests import RequestState
from hetero.framework.scheduler import OutputHandle, RequestProfile, Scheduler, StageTask
from hetero.framework.scheduler.request_admission import RequestAdmission

__all__ = ["Admit", "RequestWalk", "StepMeasures", "principal_name"]


class StepMeasures(Protocol):
    """What the walk asks a stage about one of its inputs. A
    :class:`~hetero.framework.stage_plugin.StagePlugin` answers in the engine; the simulator's
    measures of a simulated request answer there."""

    def items(self, payload: Any) -> int:
        """Inputs ``payload`` holds (a batch of texts, of images)."""
        ...

    def kv_tokens(self, payload: Any, output_tokens: int) -> int:
        """Tokens of KV cache ``payload`` holds at its longest if it generates
        ``output_tokens`` (0: the stage keeps none)."""
        ...


class Admit(Protocol):
    """How the walk asks admission about one stage: the variant and why it was degraded
    (raises :class:`~hetero.framework.errors.ShedError` to refuse)."""

    def __call__(
        self,
        stage: str,
        qos_class: str | None,
        profile: RequestProfile | None,
        *,
        items: int = 1,
        principal: Any = None,
        sequence: StageTask | None = None,
    ) -> tuple[str, str]: ...


def principal_name(principal: Any) -> str | None:
    """The name fair shares count a principal by: a string is its own name, an object its
    ``name`` (None: nobody, no share held)."""
    if principal is None or isinstance(principal, str):
        return principal
    name = getattr(principal, "name", None)
    return None if name is None else str(name)


class RequestWalk:
    """A request's stages through admission and its steps into the scheduler.

    Args:
        admission: The shared request admission (its paces, queue delays, fair shares).
        scheduler: The scheduler tasks are queued in.
        measures: Each stage's measures of its inputs (its plugin, in the engine).
        admit: How a stage is admitted; by default ``admission`` asked directly (the engine
            passes its admitter, which takes its lock and counts the decisions).
    """

    def __init__(
        self,
        admission: RequestAdmission,
        scheduler: Scheduler,
        measures: Mapping[str, StepMeasures],
        admit: Admit | None = None,
    ) -> None:
        self.admission = admission
        self.scheduler = scheduler
        self.measures = measures
        self.admit: Admit = admit if admit is not None else self._admit

    # --- a request starts -------------------------------------------------------------------

    def begin(
        self,
        state: RequestState,
        nodes: Mapping[str, GraphNode],
        *,
        skip: Iterable[str] = (),
        variant: str | None = None,
    ) -> None:
        """Take in a request's steps: each one's complexity units, payload or how it is
        composed, whether the caller gets its output; then admission of every stage, once
        for all its steps but those in ``skip`` (the cache answered them). ``variant`` runs
        every step on it, without admission's choice.

        Raises:
            ShedError: admission refused a stage (nothing is held yet).
        """
        units_of = self.admission.units
        skipped = frozenset(skip)
        by_stage: dict[str, list[str]] = {}
        answer = []
        for step in state.pipeline.order:  # one pass: what each step brings
            node = nodes[step]
            state.step_units[step] = units_of(node.profile)
            if node.compose is None:
                state.payloads[step] = node.payload
            else:
                state.composers[step] = node.compose
            if node.answer:
                answer.append(step)
            if step not in skipped:
                by_stage.setdefault(node.stage, []).append(step)
        state.answer = tuple(answer)
        for stage, steps in by_stage.items():
            state.units = max(state.units, *(state.step_units[step] for step in steps))
            if variant is not None:
                state.variants.update(dict.fromkeys(steps, variant))
                continue
            chosen, reason = self._admit_stage(state, nodes, stage, steps)
            for step in steps:
                state.variants[step] = chosen
                state.reasons[step] = reason

    def _admit_stage(
        self, state: RequestState, nodes: Mapping[str, GraphNode], stage: str, steps: list[str]
    ) -> tuple[str, str]:
        """Admission of ``stage`` for all of ``steps`` at once (their items together, the
        heaviest's profile)."""
        if len(steps) == 1:
            node = nodes[steps[0]]
            items, profile = self._items(stage, node), node.profile
        else:
            items = sum(self._items(stage, nodes[step]) for step in steps)
            profile = max((nodes[step].profile for step in steps), key=self.admission.units)
        sequence = None
        if len(steps) == 1 and nodes[steps[0]].payload is not None:
            sequence = self.sequence(stage, nodes[steps[0]].payload, state.qos_class)
        return self.admit(
            stage,
            state.qos_class,
            profile,
            items=items,
            principal=state.principal,
            sequence=sequence,
        )

    def _items(self, stage: str, node: GraphNode) -> int:
        if node.items is not None:
            return node.items
        measures = self.measures.get(stage)
        if measures is None or node.payload is None:
            return 1
        return measures.items(node.payload)

    def sequence(self, stage: str, payload: Any, qos_class: str) -> StageTask | None:
        """The sequence a generation would place in ``stage`` (a continuously batched
        KV-cache model), as admission judges it where it would finish: its prompt and the
        length nine in ten of the stage's recent generations reach; None for any other
        stage, for a static batch (it runs to its longest output), and before the stage's
        first generation finished (no length to judge by)."""
        tables = self.scheduler.tables.get(f"{stage}/full")
        measures = self.measures.get(stage)
        if tables is None or measures is None or not tables.costs.hint.kv_bytes_per_token:
            return None  # no KV cache: not a generation
        if self.admission.policy.spec.scheduler.batching.llm != "continuous":
            return None
        short = self.scheduler.output_lengths.short(stage)
        if not short:
            return None
        kv_tokens = measures.kv_tokens(payload, short)
        if not kv_tokens:
            return None
        now = self.scheduler.clock.now()
        return StageTask(
            request_id="admission",
            stage=stage,
            step=stage,
            variant="full",
            qos_class=qos_class,
            arrival=now,
            deadline=now + self.admission.deadline_s(qos_class),
            kv_tokens=kv_tokens,
            output_tokens=short,
            id=0,
        )

    def _admit(
        self,
        stage: str,
        qos_class: str | None,
        profile: RequestProfile | None,
        *,
        items: int = 1,
        principal: Any = None,
        sequence: StageTask | None = None,
    ) -> tuple[str, str]:
        admission = self.admission
        result = admission.admit(
            stage,
            admission.qos_class(qos_class),
            items=items,
            units=admission.units(profile),
            principal=principal_name(principal),
            sequence=sequence,
        )
        return result.variant, result.reason

    def hold(self, state: RequestState, stages: Iterable[str] | None = None) -> None:
        """The principal holds a share of each of ``stages`` (by default every stage
        admission judged) until the request ends."""
        who = principal_name(state.principal)
        if who is None:
            return
        if stages is None:
            stage_of = state.pipeline.stage_of
            stages = dict.fromkeys(stage_of[step] for step in state.variants)
        shares = self.admission.shares
        for stage in stages:
            state.holders.append((stage, who))
            shares.hold(stage, who)

    # --- its steps --------------------------------------------------------------------------

    def enqueue_ready(
        self,
        state: RequestState,
        inputs: Callable[[RequestState, str], Any],
        cached: Callable[[RequestState, str, str, str], bool] | None = None,
    ) -> None:
        """Queue every step whose inputs are ready. ``inputs`` gives a step's payload;
        ``cached`` answers a step from elsewhere (the feature cache: it records the output
        and returns True), which can make the next step ready at once. The policy is
        admission's (the one a reload put in force).

        Raises:
            ShedError: the scheduler's queue refused a step (the steps queued before it stay
                live: :meth:`end` drops them); and whatever ``inputs`` raises (a composed
                input its plugin refused).
        """
        scheduler = self.scheduler
        now = scheduler.clock.now()
        stages = self.admission.policy.stages
        pipeline = state.pipeline
        progressed = True
        while progressed:
            progressed = False
            for step in state.ready_steps():
                stage = pipeline.stage_of[step]
                variant = state.variants.get(step) or (
                    state.variant if state.variant in stages[stage].variants else "full"
                )
                if cached is not None and cached(state, step, stage, variant):
                    progressed = True
                    continue
                payload = inputs(state, step)
                measures = self.measures.get(stage)
                expected = scheduler.output_lengths.expected(stage)
                task = StageTask(
                    request_id=state.request_id,
                    stage=stage,
                    step=step,
                    variant=variant,
                    qos_class=state.qos_class,
                    # a part that waited for an earlier part ranks as arriving now, so the
                    # requests that came meanwhile run between a large request's parts
                    arrival=now if pipeline.steps[step].waits else state.arrival,
                    deadline=state.deadline,
                    inputs=tuple(state.outputs[dep] for dep in pipeline.after_of[step]),
                    items=measures.items(payload) if measures is not None else 1,
                    units=state.step_units.get(step, state.units),
                    enqueued_at=now,
                    output_tokens=expected,
                    # a generation's KV cache: its prompt and the output learnt so far
                    kv_tokens=measures.kv_tokens(payload, expected) if measures is not None else 0,
                )
                scheduler.enqueue(task)
                state.live_tasks[task.id] = task

    def record(self, state: RequestState, task: StageTask, output: OutputHandle) -> bool:
        """A step's task finished with ``output`` (where it is kept): True when the request
        is done."""
        state.live_tasks.pop(task.id, None)
        state.outputs[task.step] = output
        return state.done()

    def end(self, state: RequestState) -> None:
        """A request ended (done, failed, shed, cancelled): its shares go back and its queued
        steps are dropped."""
        shares = self.admission.shares
        for holder in state.holders:
            shares.release(*holder)
        state.holders.clear()
        scheduler = self.scheduler
        for task in state.live_tasks.values():
            scheduler.cancel(task)
            scheduler.output_lengths.times.dropped(task.id)
        state.live_tasks.clear()
