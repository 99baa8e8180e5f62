"""End to end with the real `openai` SDK against ONE real server on the default policy and real
models (the `models` extra, which `make venv` installs)."""

from __future__ import annotations

import base64
import io
import json
import wave
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from conftest import ServerThread
from prometheus_client.parser import text_string_to_metric_families

from hetero.framework.samples import text_page_png

OPENVINO_CPU = "npu:openvino/CPU"
ORT_CPU = "npu:onnxruntime/CPUExecutionProvider"


@pytest.fixture(scope="module")
def client(real_server: ServerThread) -> Any:
    return openai.OpenAI(base_url=f"{real_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(real_server: ServerThread) -> Any:
    with httpx.Client(base_url=real_server.url, timeout=120) as session:
        yield session


def test_ops_routes(http: httpx.Client) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    assert http.get("/ready").status_code == 200
    models = {m["id"] for m in http.get("/v1/models").json()["data"]}
    assert {"smollm2-135m-instruct", "all-minilm-l6-v2", "whisper-tiny.en"} <= models
    stages = {s["stage"]: s for s in http.get("/v1/devices").json()["stages"]}
    assert set(stages["text_embed"]["resident_on"].split(",")) & {OPENVINO_CPU, ORT_CPU}


def test_the_scheduler_places_by_calibrated_cost_and_says_where(
    http: httpx.Client, real_server: ServerThread
) -> None:
    # as warm-up left it: later traffic (other tests) may have loaded it elsewhere too
    stages = {s["stage"]: s for s in real_server.started_devices["stages"]}
    timings = stages["text_embed"]["warmup_timings_s"]
    assert isinstance(timings[OPENVINO_CPU], float) and isinstance(timings[ORT_CPU], float)
    timed = {device: t for device, t in timings.items() if isinstance(t, float)}
    fastest = min(timed, key=lambda device: timed[device])  # torch too, on a busy machine
    assert stages["text_embed"]["resident_on"] == fastest  # placed by its calibrated cost
    body = {"model": "all-minilm-l6-v2", "input": ["Where did this run?"]}
    response = http.post("/v1/embeddings", json=body)
    (run,) = json.loads(response.headers["X-Hetero-Stages"])
    assert run["stage"] == "text_embed" and run["device"] in timed
    placed = {
        sample.labels["device"]: sample.value
        for family in text_string_to_metric_families(http.get("/metrics").text)
        if family.name == "hetero_placements"
        for sample in family.samples
        if sample.labels.get("stage") == "text_embed" and sample.name.endswith("_total")
    }
    assert placed.get(run["device"], 0) >= 1


def test_embeddings_related_closer_than_unrelated(client: Any) -> None:
    result = client.embeddings.create(
        model="all-minilm-l6-v2",
        input=["A man is eating food.", "Someone is having a meal.", "The stock market fell."],
    )
    vectors = np.array([d.embedding for d in result.data])
    assert vectors.shape == (3, 384)
    related, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert related > unrelated + 0.3


def test_chat_with_an_image(client: Any) -> None:
    page = text_page_png(["HELLO WORLD", "OPEN 9 TO 5"])
    url = "data:image/png;base64," + base64.b64encode(page).decode()
    result = client.chat.completions.create(
        model="smollm2-135m-instruct",
        max_tokens=24,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What does the sign say?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
    )
    assert result.choices[0].message.content.strip()
    assert result.usage.prompt_tokens > 10
    assert result.usage.completion_tokens > 0


def test_streaming_chat(client: Any) -> None:
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct",
        max_tokens=24,
        stream=True,
        messages=[{"role": "user", "content": "Name three colours."}],
    )
    pieces = [
        chunk.choices[0].delta.content
        for chunk in stream
        if chunk.choices and chunk.choices[0].delta.content
    ]
    assert len(pieces) > 2
    assert "".join(pieces).strip()


def test_speech_then_transcription(client: Any) -> None:
    speech = client.audio.speech.create(
        model="piper-joe-medium",
        voice="joe",
        input="The weather is nice today.",
        response_format="wav",
    )
    audio = speech.read()
    with wave.open(io.BytesIO(audio)) as wav:
        seconds = wav.getnframes() / wav.getframerate()
    assert 0.8 < seconds < 6
    text = client.audio.transcriptions.create(
        model="whisper-tiny.en", file=("speech.wav", audio)
    ).text.lower()
    assert "weather" in text and "today" in text


def test_corrupt_inputs_with_real_models(http: httpx.Client) -> None:
    files = {"file": ("x.wav", b"RIFF\x00\x00\x00\x00WAVEjunkjunk")}
    response = http.post("/v1/audio/transcriptions", files=files, data={"model": "whisper-tiny.en"})
    assert response.status_code == 400
    truncated = text_page_png(["x"])[:200]
    response = http.post("/vision", json={"image_b64": base64.b64encode(truncated).decode()})
    assert response.status_code == 400
    assert response.json()["error"]["message"]


def test_metrics_parse(http: httpx.Client) -> None:
    families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}
    assert "hetero_requests" in families
    assert "hetero_stage_duration_seconds" in families
    assert "hetero_queue_depth" in families
    stages = {s.labels["stage"] for s in families["hetero_stage_duration_seconds"].samples}
    assert {"text_embed", "llm_generate"} <= stages
