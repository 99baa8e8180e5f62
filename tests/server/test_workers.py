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


def test_closing_while_models_load_releases_every_model_loaded() -> None:
    from fakes import FAKE_STAGES

    from hetero.framework.policy import load_policy
    from hetero.framework.server import ServingRuntime

    entered, release = threading.Event(), threading.Event()
    made: list[Any] = []

    class SlowEmbed(FAKE_STAGES["text_embed"]):  # type: ignore[misc, valid-type]
        def load(self) -> None:
            made.append(self)
            entered.set()
            assert release.wait(30)
            super().load()

    stages = {**FAKE_STAGES, "text_embed": SlowEmbed}
    runtime = ServingRuntime(
        load_policy("builtin:default"), stage_models=stages, use_cache=False, probe_runtimes=False
    )
    loader = threading.Thread(target=runtime.start)
    loader.start()
    assert entered.wait(30)
    runtime.close()  # while text_embed is still loading
    release.set()
    loader.join(30)
    assert not loader.is_alive() and not runtime.ready
    assert made and not any(model.loaded for model in made)  # released after it finished
    assert all(not stage.model.loaded for stage in runtime.stages.values())


def test_close_stops_a_running_generation_before_the_model_is_released() -> None:
    from hetero.framework.server.calls import Generation

    started = threading.Event()

    def generate(variant: str, jobs: Sequence[Any]) -> list[Any]:
        started.set()
        for job in jobs:
            assert job.stop.wait(60)  # a generation that only ends when asked to
        return ["stopped" for _ in jobs]

    workers = StageWorkers(
        "llm_generate",
        generate,
        weights={"standard": 1.0},
        aging_per_second=1.0,
        bound=8,
        class_bounds={"standard": 8},
    )
    job = workers.submit(Generation([], max_tokens=8), "full", "standard")
    assert started.wait(30)
    assert not workers.stopped
    workers.close()
    assert workers.stopped and job.future.result(timeout=1) == "stopped"
