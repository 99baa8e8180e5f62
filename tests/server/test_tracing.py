"""Tracing end to end: a real OTLP/HTTP receiver on loopback gets the span tree of a chat
request with an image (request span, a span per stage, the stage spans: admission, cache
lookup, queue wait, placement, device run, stream), under the client's ``traceparent``.

The stages are the shipped models (EfficientNet-Lite0, PP-OCRv4, SmolLM2) of the default policy,
trimmed to the three a chat with an image runs, on this host's devices through the real
engine."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from conftest import ServerThread
from otlp_receiver import OtlpReceiver, ReceivedSpan

from hetero.framework.policy import builtin_policy_text, load_policy_text
from hetero.framework.samples import text_page_png
from hetero.framework.server import Serving, create_app
from hetero.framework.tracing.traceparent import format_traceparent, parse_traceparent

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def traced(receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    policy = yaml.safe_load(builtin_policy_text("default"))
    chat_stages = {"vision_encode", "ocr", "llm_generate"}  # what a chat with an image runs
    policy["stages"] = {k: v for k, v in policy["stages"].items() if k in chat_stages}
    policy["routes"] = {
        route: target
        for route, target in policy["routes"].items()
        if target in chat_stages or target in policy["pipelines"]
    }
    policy["devices"]["deny"] = ["dummy"]
    policy["tracing"] = {
        "enabled": True,
        "endpoint": receiver.endpoint,
        "sampling": 1.0,
        "service_name": "hetero-test",
    }
    runtime = Serving(
        load_policy_text(yaml.safe_dump(policy, sort_keys=False), "traced"),
        cache_directory=tmp_path_factory.mktemp("traced-cache"),
    )
    runtime.start()
    app = create_app(runtime)
    with ServerThread(app) as server:
        yield server, app
    runtime.close()


def _chat(url: str, headers: dict[str, str]) -> httpx.Response:
    page = base64.b64encode(text_page_png(["HELLO WORLD"])).decode()
    body = {
        "model": "smollm2-135m-instruct",
        "max_tokens": 8,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What does the sign say?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{page}"}},
                ],
            }
        ],
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def _only(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def test_chat_with_an_image_exports_the_span_tree(traced: Any, receiver: OtlpReceiver) -> None:
    server, app = traced
    parent = format_traceparent(CLIENT_TRACE, CLIENT_SPAN, True)
    answer = _chat(server.url, {"traceparent": parent, "x-request-id": "client-req-1"})
    assert answer.status_code == 200, answer.text
    assert app.state.tracer.flush()  # exports synchronously: the receiver has every span

    assert answer.headers["x-request-id"] == "client-req-1"
    assert answer.headers["x-trace-id"] == CLIENT_TRACE
    echoed = parse_traceparent(answer.headers["traceparent"])
    assert echoed is not None and echoed[0] == CLIENT_TRACE

    spans = receiver.trace(CLIENT_TRACE)
    root = _only(spans, "POST /v1/chat/completions")
    assert root.parent_id == CLIENT_SPAN  # the client's traceparent is the parent
    assert root.span_id == echoed[1]  # and the answer names the server's span
    assert root.service == "hetero-test"
    assert root.attributes["hetero.request_id"] == "client-req-1"
    assert root.attributes["http.response.status_code"] == 200

    ran_on = {run["stage"]: run["device"] for run in json.loads(answer.headers["x-hetero-stages"])}
    stages = {s.name: s for s in receiver.children(CLIENT_TRACE, root)}
    assert set(stages) == {"stage vision_encode", "stage ocr", "stage llm_generate"}
    for name, span in stages.items():
        stage = name.removeprefix("stage ")
        assert span.attributes["hetero.device"] == ran_on[stage]
        assert root.start_ns <= span.start_ns <= span.end_ns <= root.end_ns
        children = {c.name: c for c in receiver.children(CLIENT_TRACE, span)}
        assert {"admission", "queue_wait", "placement", "device_run"} <= set(children), name
        assert children["placement"].attributes["hetero.device"] == ran_on[stage]
        assert children["device_run"].attributes["hetero.device"] == ran_on[stage]
        assert children["device_run"].attributes["hetero.batch_size"] >= 1
        assert children["admission"].attributes["hetero.variant"] in ("full", "light")
        for child in children.values():
            assert span.start_ns <= child.start_ns <= child.end_ns <= span.end_ns, child.name
    for cached in ("stage vision_encode", "stage ocr"):
        lookup = _only(list(receiver.children(CLIENT_TRACE, stages[cached])), "cache_lookup")
        assert lookup.attributes["hetero.cache.hit"] is False
    llm = {c.name: c for c in receiver.children(CLIENT_TRACE, stages["stage llm_generate"])}
    assert llm["stream"].attributes["hetero.tokens"] >= 1
    assert llm["stream"].attributes["hetero.time_to_first_token_s"] >= 0


def test_a_repeated_image_is_a_cache_hit_in_its_trace(traced: Any, receiver: OtlpReceiver) -> None:
    server, app = traced
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    first = _chat(server.url, {})
    again = _chat(server.url, {"traceparent": format_traceparent(trace_id, CLIENT_SPAN, True)})
    assert first.status_code == again.status_code == 200
    assert app.state.tracer.flush()
    root = _only(receiver.trace(trace_id), "POST /v1/chat/completions")
    stages = {s.name: s for s in receiver.children(trace_id, root)}
    vision = stages["stage vision_encode"]
    assert vision.attributes["hetero.cached"] is True
    assert vision.attributes["hetero.device"] == "cache"
    children = {c.name: c for c in receiver.children(trace_id, vision)}
    assert children["cache_lookup"].attributes["hetero.cache.hit"] is True
    assert children["cache_lookup"].attributes["hetero.cache.tier"] == "memory"
    assert "device_run" not in children  # nothing ran: the cache answered


def test_errors_carry_the_request_and_trace_ids(traced: Any, receiver: OtlpReceiver) -> None:
    server, app = traced
    trace_id = "11112222333344445555666677778888"
    answer = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=b"{not json",
        headers={
            "content-type": "application/json",
            "traceparent": format_traceparent(trace_id, CLIENT_SPAN, True),
        },
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["trace_id"] == trace_id == answer.headers["x-trace-id"]
    assert error["request_id"] == answer.headers["x-request-id"]
    assert error["request_id"].startswith("req-")
    assert app.state.tracer.flush()
    root = _only(receiver.trace(trace_id), "POST /v1/chat/completions")
    assert root.attributes["http.response.status_code"] == 400


def test_without_tracing_no_opentelemetry_module_is_imported() -> None:
    """Tracing off (the default policy): a request is served with its ids and hetero imports
    no OpenTelemetry module. FastAPI (0.165+) itself imports ``opentelemetry-api`` (its own
    ``fastapi.telemetry``, a hard dependency), so "none" is measured against a bare FastAPI app
    in the same kind of process: hetero adds nothing to that set, and no SDK, exporter or
    protobuf module is loaded. Control: with tracing on, the SDK and exporter are imported."""
    script = textwrap.dedent(
        """
        import sys
        from fastapi import FastAPI
        from fastapi.testclient import TestClient

        if sys.argv[1] == "bare":
            app = FastAPI()
            app.get("/health")(lambda: {"ok": True})
        else:
            from hetero.framework.policy import builtin_policy_text, load_policy_text
            from hetero.framework.server import Serving, create_app

            text = builtin_policy_text("default") + sys.argv[1]
            app = create_app(Serving(load_policy_text(text, "p")))
        with TestClient(app) as client:
            answer = client.get("/health", headers={"traceparent": sys.argv[2]})
        assert answer.status_code == 200, answer.text
        if sys.argv[1] != "bare":
            assert answer.headers["x-request-id"].startswith("req-")
            assert answer.headers["x-trace-id"] == sys.argv[2].split("-")[1]
        print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")))
        """
    )
    parent = format_traceparent(CLIENT_TRACE, CLIENT_SPAN, True)

    def loaded(extra: str) -> set[str]:
        env = {**os.environ, "PYTHONSAFEPATH": "1"}
        done = subprocess.run(
            [sys.executable, "-c", script, extra, parent],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.strip().splitlines()
        return set(lines[-1].split()) if lines else set()

    def tracing_modules(names: set[str]) -> set[str]:
        parts = ("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.proto")
        return {name for name in names if name.startswith(parts)}

    off = loaded("")
    assert off <= loaded("bare"), off - loaded("bare")
    assert tracing_modules(off) == set()
    on = loaded("\ntracing:\n  enabled: true\n  endpoint: http://127.0.0.1:9/v1/traces\n")
    assert {"opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http"} <= on


@pytest.mark.parametrize(
    ("header", "parsed"),
    [
        (f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", (CLIENT_TRACE, CLIENT_SPAN, True)),
        (f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00", (CLIENT_TRACE, CLIENT_SPAN, False)),
        (f"ff-{CLIENT_TRACE}-{CLIENT_SPAN}-01", None),
        (f"00-{'0' * 32}-{CLIENT_SPAN}-01", None),
        (f"00-{CLIENT_TRACE}-{'0' * 16}-01", None),
        ("00-xyz-abc-01", None),
        ("", None),
    ],
)
def test_traceparent_parsing(header: str, parsed: tuple[str, str, bool] | None) -> None:
    assert parse_traceparent(header) == parsed


def test_a_chat_with_an_image_is_one_request_graph(
    traced: Any, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ``Engine.submit_graph`` (no per-stage submits): vision and OCR queued together,
    the LLM queued when both are done; the image header read once, the prompt tokenized once
    (the plugin generates from those ids), and admission and placement judge each step by
    the same profile."""
    from hetero.framework.server import pipelines

    server, app = traced
    runtime: Serving = app.state.runtime
    engine = runtime.engine
    assert engine is not None
    calls: dict[str, int] = {"graphs": 0, "stages": 0, "headers": 0, "prompts": 0}
    admitted: dict[str, Any] = {}
    queued: dict[str, float] = {}
    submit_graph, submit_stage = engine.submit_graph, engine.submit_stage
    admit = engine.admitter.admit
    enqueue, image_size = engine.scheduler.enqueue, pipelines.image_size
    llm = runtime.stage_of_kind("llm_generate").plugin
    tokenize = llm._prompt_ids  # every tokenization of a prompt, the plugin's own included

    def counting(name: str, call: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return call(*args, **kwargs)

        return counted

    def admitting(stage: str, qos: Any, profile: Any, **kwargs: Any) -> Any:
        admitted[stage] = profile
        return admit(stage, qos, profile, **kwargs)

    def enqueueing(task: Any) -> Any:
        queued[task.stage] = task.units
        return enqueue(task)

    monkeypatch.setattr(engine, "submit_graph", counting("graphs", submit_graph))
    monkeypatch.setattr(engine, "submit_stage", counting("stages", submit_stage))
    monkeypatch.setattr(engine.admitter, "admit", admitting)
    monkeypatch.setattr(engine.scheduler, "enqueue", enqueueing)
    monkeypatch.setattr(pipelines, "image_size", counting("headers", image_size))
    monkeypatch.setattr(llm, "_prompt_ids", counting("prompts", tokenize))
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4736"
    page = base64.b64encode(text_page_png(["ONE GRAPH"])).decode()  # not cached yet
    body = {
        "model": "smollm2-135m-instruct",
        "max_tokens": 4,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What does it say?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{page}"}},
                ],
            }
        ],
    }
    headers = {"traceparent": format_traceparent(trace_id, CLIENT_SPAN, True)}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    assert calls == {"graphs": 1, "stages": 0, "headers": 1, "prompts": 1}
    weights = runtime.spec.circuit_breaker.complexity
    assert set(admitted) == {"vision_encode", "ocr", "llm_generate"}
    for stage, profile in admitted.items():
        assert queued[stage] == profile.score(weights), stage
    assert admitted["vision_encode"].image_pixels > 0

    assert app.state.tracer.flush()
    root = _only(receiver.trace(trace_id), "POST /v1/chat/completions")
    stages = {s.name: s for s in receiver.children(trace_id, root)}
    vision, ocr = stages["stage vision_encode"], stages["stage ocr"]
    assert vision.start_ns < ocr.end_ns and ocr.start_ns < vision.end_ns  # overlapping
    runs = [
        {c.name: c for c in receiver.children(trace_id, s)}["device_run"] for s in (vision, ocr)
    ]
    llm_children = {c.name: c for c in receiver.children(trace_id, stages["stage llm_generate"])}
    assert llm_children["queue_wait"].start_ns >= max(run.end_ns for run in runs)  # then the LLM
