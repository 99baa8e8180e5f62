"""Every route submits one request graph to the engine: the image question and description
pipelines, speech synthesis and both transcription routes are each exactly one
``Engine.submit_graph`` (no per-stage submits), and the image question's vision and OCR steps
are queued together, before either has run."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from conftest import ServerThread

from hetero.framework.samples import text_page_png


@pytest.fixture(scope="module")
def counted(real_server: ServerThread) -> Iterator[tuple[httpx.Client, dict[str, Any]]]:
    """The shared real server, its engine's submits and queueing recorded."""
    runtime = real_server.server.config.app.state.runtime
    engine = runtime.engine
    record: dict[str, Any] = {"graphs": 0, "stages": 0, "events": []}
    patched = pytest.MonkeyPatch()

    def counting(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def counted_call(*args: Any, **kwargs: Any) -> Any:
            record[name] += 1
            return call(*args, **kwargs)

        return counted_call

    enqueue, finish = engine.scheduler.enqueue, engine.outcomes.finish

    def enqueueing(task: Any) -> Any:
        record["events"].append(("queued", task.stage, task.id))
        return enqueue(task)

    def finishing(outcome: Any) -> Any:
        task = outcome.dispatch.task
        record["events"].append(("done", task.stage, task.id))
        return finish(outcome)

    patched.setattr(engine, "submit_graph", counting("graphs", engine.submit_graph))
    patched.setattr(engine, "submit_stage", counting("stages", engine.submit_stage))
    patched.setattr(engine.scheduler, "enqueue", enqueueing)
    patched.setattr(engine.outcomes, "finish", finishing)
    with httpx.Client(base_url=real_server.url, timeout=300) as http:
        yield http, record
    patched.undo()


def _one_graph(record: dict[str, Any], send: Callable[[], httpx.Response]) -> httpx.Response:
    record.update(graphs=0, stages=0, events=[])
    response = send()
    assert response.status_code == 200, response.text
    assert (record["graphs"], record["stages"]) == (1, 0)
    return response


def test_the_image_routes_are_one_graph_each(counted: tuple[httpx.Client, dict[str, Any]]) -> None:
    http, record = counted
    fresh = uuid.uuid4().hex[:8].upper()  # content no earlier test left in the feature cache
    page = base64.b64encode(text_page_png(["ONE GRAPH", fresh])).decode()
    _one_graph(
        record,
        lambda: http.post(
            "/v1/image/question",
            json={"inputs": {"image": page}, "prompt": "What does it say?", "max_tokens": 4},
        ),
    )
    events = [event[:2] for event in record["events"]]
    first_done = next(i for i, event in enumerate(events) if event[0] == "done")
    assert {("queued", "vision_encode"), ("queued", "ocr")} <= set(events[:first_done])
    assert events.index(("queued", "llm_generate")) > first_done  # once both were done
    other = base64.b64encode(text_page_png(["DESCRIBE ME", fresh])).decode()
    _one_graph(
        record,
        lambda: http.post("/v1/image/describe", json={"image": other, "max_tokens": 4}),
    )


def test_the_speech_routes_are_one_graph_each(counted: tuple[httpx.Client, dict[str, Any]]) -> None:
    http, record = counted
    speech = _one_graph(
        record,
        lambda: http.post(
            "/v1/audio/speech",
            json={
                "model": "piper-joe-medium",
                "voice": "joe",
                "input": "One graph per route.",
                "response_format": "wav",
            },
        ),
    )
    audio = speech.content
    _one_graph(
        record,
        lambda: http.post(
            "/v1/audio/transcriptions",
            files={"file": ("speech.wav", audio)},
            data={"model": "whisper-tiny.en"},
        ),
    )
    _one_graph(
        record,
        lambda: http.post("/v1/speech/transcribe", files={"file": ("speech.wav", audio)}),
    )


def test_a_large_embeddings_request_is_one_graph_of_parts(
    counted: tuple[httpx.Client, dict[str, Any]],
) -> None:
    """More texts than one model call holds: one graph whose steps are the parts, each
    queued only once the part two before it is done (never all at once)."""
    http, record = counted
    fresh = uuid.uuid4().hex[:8]
    texts = [f"part of a large request {fresh} {n}" for n in range(200)]
    response = _one_graph(
        record,
        lambda: http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": texts}),
    )
    assert [item["index"] for item in response.json()["data"]] == list(range(200))
    live: set[int] = set()  # by task: a retried part is queued again, done once
    parts: set[int] = set()
    most = 0
    for event, stage, task_id in record["events"]:
        assert stage == "text_embed"
        if event == "queued":
            live.add(task_id)
            parts.add(task_id)
        else:
            live.discard(task_id)
        most = max(most, len(live))
    assert len(parts) >= 200 // 32 + 1 and most <= 2  # several parts, two at a time at most
