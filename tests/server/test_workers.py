"""Stage workers: a heavy stage's threads can run at a lower CPU priority (``server.nice``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from hetero.framework.server.workers import StageWorkers


def _priority_of_worker(nice: int) -> int:
    def call(variant: str, payloads: Sequence[Any]) -> list[Any]:
        return [os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) for _ in payloads]

    workers = StageWorkers(
        "vision_encode",
        call,
        weights={"standard": 1.0},
        aging_per_second=1.0,
        bound=8,
        class_bounds={"standard": 8},
        nice=nice,
    )
    try:
        return int(workers.submit(b"x", "full", "standard").future.result(timeout=30))
    finally:
        workers.close()


def test_a_stage_with_nice_runs_its_model_calls_at_lower_priority() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert _priority_of_worker(0) == base  # the control: unchanged without the setting
    assert _priority_of_worker(10) == 10
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the server's own threads keep theirs
