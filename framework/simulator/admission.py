"""The engine's request admission as the simulator uses it: the same class, told how many runs
a continuously batched LLM stage takes at once.

A modelled LLM stage batching continuously (``scheduler.batching.llm: continuous``) runs up to
its ``max_batch`` sequences side by side on each device (:mod:`decode`), while the scheduler's
tables count one run slot per device (its outstanding limit is that batch). Admission's queue
delay divides the work ahead by the runs taken at once; with one per device it would judge a
fleet of continuous batches as serial runs and shed requests that would finish in time."""

from __future__ import annotations

from hetero.framework.policy import Policy
from hetero.framework.scheduler.request_admission import RequestAdmission
from hetero.framework.scheduler.scheduler import Scheduler

__all__ = ["SimAdmission"]


class SimAdmission(RequestAdmission):
    """:class:`RequestAdmission` with each continuous LLM device counted as its batch cap."""

    def __init__(self, policy: Policy, scheduler: Scheduler) -> None:
        super().__init__(policy, scheduler)
        spec = policy.spec
        continuous = spec.scheduler.batching.llm == "continuous"
        self._sequences = {
            name: stage.variants["full"].max_batch
            for name, stage in spec.stages.items()
            if continuous and stage.variants["full"].kv_bytes_per_token
        }

    def run_slots(self, stage: str) -> int:
        """The base count of runs at once, times the batch cap where sequences run side by
        side."""
        return super().run_slots(stage) * self._sequences.get(stage, 1)
