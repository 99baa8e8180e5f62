"""Admission on the real server and real models: a stream of tiny requests cannot make a
normal one look heavy (it used to: 429, "34.0x the recent p95", ten times out of ten), and a
request of 256 long texts runs in bounded parts with other requests between them, its memory
given back afterwards."""

from __future__ import annotations

from typing import Any

import httpx
import psutil
import pytest
from conftest import ServerThread

from hetero.models.embed import TOKENS_PER_CALL, TextEmbedder

MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def http(real_server: ServerThread) -> Any:
    with httpx.Client(base_url=real_server.url, timeout=300) as session:
        yield session


def embed(http: httpx.Client, value: str | list[str]) -> httpx.Response:
    return http.post("/v1/embeddings", json={"model": MODEL, "input": value})


def test_tiny_requests_do_not_poison_admission(http: httpx.Client) -> None:
    codes = {embed(http, f"x{i}").status_code for i in range(600)}
    sentence = " ".join(f"word{i}" for i in range(25))
    answers = [embed(http, sentence).status_code for _ in range(10)]
    assert codes == {200} and answers == [200] * 10


def test_a_large_request_runs_in_bounded_parts_and_gives_its_memory_back(
    http: httpx.Client, real_server: ServerThread
) -> None:
    text = ("The quick brown fox jumps over the lazy dog. " * 200)[:8000]
    texts = [f"{text} {i}" for i in range(256)]  # 2 MB of JSON, 256 x ~1,800 tokens
    parts = TextEmbedder().split(texts, 32)
    assert len(parts) >= 256 * 256 // TOKENS_PER_CALL  # each text counts its first 256 tokens
    assert all(len(part) <= 32 for part in parts) and sum(map(len, parts)) == 256
    per_part = TOKENS_PER_CALL // 256  # texts of a full part at this length
    embed(http, [f"{text} warm-up {i}" for i in range(per_part)])  # a part of this size ran once
    before = psutil.Process().memory_info().rss
    batches = _batches(http)
    response = embed(http, texts)
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 256
    assert _batches(http) - batches >= len(parts)  # one model call per part, at least
    grown = psutil.Process().memory_info().rss - before
    assert grown < 500 * 2**20, f"RSS grew {grown / 2**20:.0f} MB"


def _batches(http: httpx.Client) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(http.get("/metrics").text):
        if family.name == "hetero_batch_size":
            for sample in family.samples:
                if sample.name.endswith("_count") and sample.labels["stage"] == "text_embed":
                    return sample.value
    return 0.0
