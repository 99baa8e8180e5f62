"""Served stages are placed by the scheduler: on the device the cost model prefers (here the
out-of-tree dummy plugin's), around a device that starts failing (its breaker opens, requests
in flight are retried elsewhere, none is lost), and under a memory budget that holds only some
models (the memory manager evicts and reloads, minimum residency honoured). Real models, real
runtimes; the dummy devices are the fake accelerators of tests/plugins/dummy_backend (ONNX's
reference evaluator, a real independent executor)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.samples import text_page_png
from hetero.framework.server import Serving, create_app
from hetero.models.embed import TextEmbedder
from hetero_dummy_backend import DummyBackend

QOS = """qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: silver, queue_bound: 256}}
sla_tiers: {silver: {deadline_ms: 60000}}
cache: {enabled: false}
"""
EMBED_ANYWHERE = (
    """version: 1
stages:
  text_embed:
    modality: text
    model_version: all-minilm-l6-v2@1
    variants:
      full: {flops_per_item: 1 GFLOPS, bytes_per_item: 1 MB, max_batch: 8}
routes:
  /v1/embeddings: text_embed
circuit_breaker:
  device: {window: 6, min_calls: 3, error_rate: 0.5, open_s: 600}
scheduler:
  measured_smoothing: 0.001  # the dummies stay preferred however slow a loaded CPU runs them
"""
    + QOS
)
ORT = "npu:onnxruntime/CPUExecutionProvider"
DUMMIES = ("dummy:0", "dummy:1")


def _embed(client: TestClient, index: int) -> tuple[int, str]:
    body = {"model": "all-minilm-l6-v2", "input": [f"Sentence number {index} is here."]}
    response = client.post("/v1/embeddings", json=body)
    (run,) = json.loads(response.headers.get("X-Hetero-Stages", '[{"device": "-"}]'))
    return response.status_code, str(run["device"])


def _sample(client: TestClient, name: str, labels: dict[str, str]) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        float(sample.value)
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


@pytest.fixture
def preferred_dummy(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """text_embed served where the dummy devices look fastest to the cost model."""
    monkeypatch.setattr(DummyBackend, "peak_flops", 1e16)  # read at discovery: a fresh registry
    monkeypatch.setattr(DummyBackend, "failing", False)
    serving = Serving(
        load_policy_text(EMBED_ANYWHERE, "embed-anywhere.yaml"),
        stage_models={"text_embed": TextEmbedder},
        registry=Registry(),
        probe_runtimes=False,  # trust the cost model: it prefers the dummy devices
    )
    serving.start()
    with TestClient(create_app(serving)) as client:
        yield client
    serving.close()


def test_the_preferred_plugin_device_serves_and_a_failing_one_is_routed_around(
    preferred_dummy: TestClient,
) -> None:
    client = preferred_dummy
    first = [_embed(client, i) for i in range(4)]
    assert all(status == 200 for status, _ in first)
    assert {device for _, device in first} <= set(DUMMIES)  # the cost model's choice serves
    assert sum(_sample(client, "hetero_placements_total", {"device": d}) for d in DUMMIES) >= 4
    DummyBackend.failing = True  # the devices start failing while requests keep coming
    with ThreadPoolExecutor(8) as pool:
        second = list(pool.map(lambda i: _embed(client, i), range(4, 28)))
    assert [status for status, _ in second] == [200] * 24  # none lost
    assert not {device for _, device in second} & set(DUMMIES)  # each answered elsewhere
    failures = sum(_sample(client, "hetero_stage_failures_total", {"device": d}) for d in DUMMIES)
    retries = _sample(client, "hetero_stage_retries_total", {"stage": "text_embed"})
    opened = [_sample(client, "hetero_breaker_open", {"device": d}) for d in DUMMIES]
    assert failures >= 1 and retries >= failures
    assert 1.0 in opened  # a breaker opened: new requests are no longer placed there
    placed_before = sum(_sample(client, "hetero_placements_total", {"device": d}) for d in DUMMIES)
    assert all(status == 200 for status, _ in (_embed(client, i) for i in range(28, 32)))
    placed_after = sum(_sample(client, "hetero_placements_total", {"device": d}) for d in DUMMIES)
    assert placed_after - placed_before < 4  # not every new request tries the dummy first


TORCH = "npu:torch/cpu"


def _budget_policy() -> Any:
    """The default policy (all six stages), the ONNX stages on ONNX Runtime's CPU device with a
    210 MB budget (after the 25 % reserve) that holds at most two of them at once, the LLM on
    torch, and a minimum residency of 0.2 s."""
    from hetero.framework.policy import builtin_policy_text

    text = builtin_policy_text("default")
    edits = (
        (
            "  allow: [cpu, npu]\n",
            f'  allow: ["{ORT}", "{TORCH}"]\n  overrides:\n    "{ORT}": {{memory: 280 MB}}\n',
        ),
        ("  min_residency_s: 30\n", "  min_residency_s: 0.2\n"),
        ("cache:\n", "cache:\n  enabled: false\n"),
    )
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    pins = {s: "onnxruntime" for s in ("vision_encode", "ocr", "asr", "tts", "text_embed")}
    text += "\nserver:\n  runtimes: " + json.dumps({**pins, "llm_generate": "torch"}) + "\n"
    return load_policy_text(text, "default-under-a-budget.yaml")


def test_a_memory_budget_for_some_models_serves_all_by_evicting_and_reloading() -> None:
    serving = Serving(_budget_policy(), registry=Registry(), probe_runtimes=False)
    serving.start()
    try:
        assert set(serving.stages) == set(serving.spec.stages)  # all six
        assert serving.engine is not None
        index = serving.engine.scheduler.fleet.index[ORT]
        manager = serving.engine.scheduler.memory[index]
        tables = serving.engine.scheduler.tables
        onnx = ("vision_encode", "ocr", "asr", "tts", "text_embed")
        sizes = {name: tables[f"{name}/full"].costs.hint.resident_bytes for name in onnx}
        assert sum(sizes.values()) > 2 * manager.capacity  # at most about half fits at once
        image = base64.b64encode(text_page_png(["Budget test", "OPEN 9 TO 5"])).decode()
        with TestClient(create_app(serving)) as client:
            for round_ in range(2):  # a mixed load over all six, needing the others out
                embed = client.post(
                    "/v1/embeddings",
                    json={"model": "all-minilm-l6-v2", "input": [f"Round {round_} text."]},
                )
                speech = client.post(
                    "/v1/audio/speech",
                    json={"model": "piper-joe-medium", "input": "Hello.", "response_format": "wav"},
                )
                heard = client.post(
                    "/v1/audio/transcriptions",
                    files={"file": ("s.wav", speech.content)},
                    data={"model": "whisper-tiny.en"},
                )
                asked = client.post(  # vision_encode and ocr, then llm_generate on torch
                    "/v1/pipelines/image_question",
                    json={"inputs": {"image": image}, "max_tokens": 4},
                )
                statuses = [r.status_code for r in (embed, speech, heard, asked)]
                assert statuses == [200] * 4, [r.text[:200] for r in (embed, speech, heard, asked)]
            evictions = _sample(client, "hetero_model_evictions_total", {"device": ORT})
            loads = _sample(client, "hetero_model_loads_total", {"device": ORT})
        assert evictions >= 3 and loads >= len(onnx) + 3  # evicted and reloaded
        assert manager.used <= manager.capacity
        ages = [age for _, age in manager.evicted]
        assert ages and min(ages) >= 0.2  # nothing left before its minimum residency
    finally:
        serving.close()
