"""When a new LLM sequence would finish, judged at admission: on the device the placement by
added completion time (:mod:`completion`) would choose for it now, its predicted completion
there times how long such predictions have run (:class:`SequenceTimes`). A request that would
miss its deadline there is a miss whatever follows; admitting it only slows the sequences it
joins (issue 36, docs/scheduler.md)."""

from __future__ import annotations

import numpy as np

from hetero.framework.scheduler.scheduler import Scheduler
from hetero.framework.scheduler.tasks import StageTask

__all__ = ["sequence_completion_s"]


def sequence_completion_s(scheduler: Scheduler, task: StageTask, now: float) -> float | None:
    """Seconds from ``now`` until sequence ``task`` would generate its last token on the
    device placement would give it now, or None where that is not known: another placement
    than the cost model, not a continuously batched KV-cache model, no output length or time
    ratio learnt yet, or no device with room for it now (it would wait, and the stage's pace
    and queue judge it)."""
    if scheduler.placement != "cost_model" or not task.output_tokens:
        return None
    tables = scheduler.tables.get(f"{task.stage}/{task.variant}")
    if tables is None or not tables.costs.hint.kv_bytes_per_token:
        return None
    if not scheduler._continuous_llm():
        return None
    ratio = scheduler.output_lengths.times.ratio(task.stage)
    if ratio is None:
        return None
    mask, _ = scheduler._eligible(task, tables.costs, now)
    mask &= tables.has_room
    if scheduler._drains:
        mask &= ~tables.draining
    room = scheduler._without_eviction(tables, mask)
    if not np.count_nonzero(room):
        return None
    chosen = scheduler._soonest_done(task, tables, room, scheduler.kv_bytes(task, tables))
    predicted, scheduler._predicted = scheduler._predicted, None
    if predicted is None or predicted[0] != task.id or not np.count_nonzero(chosen):
        return None
    at = np.flatnonzero(predicted[1] == int(np.flatnonzero(chosen)[0]))
    return float(predicted[2][int(at[0])]) * ratio if at.size else None
