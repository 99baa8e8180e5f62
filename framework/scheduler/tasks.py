"""What flows through the scheduler: one stage of one request, and where outputs live."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OutputHandle", "StageTask"]

_task_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class OutputHandle:
    """A stage's output, and the device it was left on (so placement sees the transfer)."""

    device_id: str
    value: Any
    size_bytes: int


@dataclass(slots=True)
class StageTask:
    """One pipeline step of one request, waiting to be placed.

    Attributes:
        request_id: The request it belongs to.
        stage: Stage name.
        step: Step name in the pipeline.
        variant: ``full`` or ``light`` (chosen by the complexity breaker).
        qos_class: QoS class name.
        arrival: When the request arrived (aging counts from here); for a part of a large
            input that waited for an earlier part, when it was queued.
        deadline: The request's arrival plus the SLA tier's deadline.
        inputs: Output handles of the steps whose outputs it takes (or the payload's, for a
            source step).
        items: Items in this task (a batch dimension), for cost estimates.
        units: The request's complexity units (its profile's weighted sum), for the pace
            admission estimates with.
        excluded: Devices that already failed it; placement avoids them.
        failures: What each of those devices raised, for the final error.
        attempts: Placements tried so far.
        kv_tokens: Tokens of context the request holds at its longest (prompt plus output),
            for a stage whose model keeps a KV cache: placement reserves their blocks.
        output_tokens: The tokens the request is expected to generate (its decode steps:
            what the stage's finished sequences produced, ``Scheduler.output_lengths``), for
            an LLM sequence's expected completion; 0: not known.
    """

    request_id: str
    stage: str
    step: str
    variant: str
    qos_class: str
    arrival: float
    deadline: float
    inputs: tuple[OutputHandle, ...] = ()
    items: int = 1
    units: float = 0.0
    excluded: frozenset[str] = frozenset()
    attempts: int = 0
    cancelled: bool = False
    queued: bool = False
    enqueued_at: float = 0.0
    kv_tokens: int = 0
    output_tokens: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    id: int = field(default_factory=lambda: next(_task_ids))
