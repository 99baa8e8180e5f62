"""The HTTP layer on fake stages: error shapes, auth, limits, disconnects, and a fuzz test."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
from conftest import API_KEY, REVIEWER_KEY, ServerThread
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero.framework.samples import photo_png, speech_like_wav

CHAT_MODEL = "smollm2-135m-instruct"
EMBED_MODEL = "all-minilm-l6-v2"


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code", "request_id"}
    assert error["request_id"] == response.headers["x-request-id"]
    assert error["message"]
    if code is not None:
        assert error["code"] == code, error
    return dict(error)


@pytest.fixture(scope="module")
def client(fake_server: ServerThread) -> Any:
    with httpx.Client(base_url=fake_server.url, timeout=30) as http:
        yield http


def test_corrupt_image_is_a_400_naming_the_part(client: httpx.Client) -> None:
    url = "data:image/png;base64," + base64.b64encode(b"\x89PNG not really").decode()
    body = {
        "model": CHAT_MODEL,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
    }
    error = assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_image")
    assert "messages.0.content.1" in error["message"]
    upload = client.post("/v1/image/describe", files={"file": ("x.png", b"\x89PNG not really")})
    assert assert_error(upload, 400, "invalid_image")["param"] == "file"
    as_json = client.post("/v1/image/describe", json={"image": "bm90IGFuIGltYWdl"})
    assert assert_error(as_json, 400, "invalid_image")["param"] == "image"


def test_remote_image_urls_are_refused(client: httpx.Client) -> None:
    body = {
        "model": CHAT_MODEL,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}
                ],
            }
        ],
    }
    assert_error(client.post("/v1/chat/completions", json=body), 400, "unsupported_url")


def test_corrupt_audio_is_a_400(client: httpx.Client) -> None:
    files = {"file": ("a.wav", b"RIFF....WAVEfmt garbage")}
    response = client.post(
        "/v1/audio/transcriptions", files=files, data={"model": "whisper-tiny.en"}
    )
    assert_error(response, 400, "invalid_audio")


def _claiming(wav: bytes, data_bytes: int) -> bytes:
    """``wav`` with its RIFF and data chunk sizes saying ``data_bytes`` of audio follow."""
    at = wav.index(b"data")
    header = bytearray(wav)
    header[4:8] = min(at + data_bytes, 0xFFFFFFFF).to_bytes(4, "little")
    header[at + 4 : at + 8] = data_bytes.to_bytes(4, "little")
    return bytes(header)


def test_a_wav_whose_header_claims_more_than_it_holds_is_a_400(client: httpx.Client) -> None:
    wav = speech_like_wav(1.0)
    honest = _claiming(wav, len(wav) - wav.index(b"data") - 8)  # the control: what it holds
    assert honest == wav
    for claimed in (len(wav), 0xFFFFFFF0):  # a little more, and about 4 GiB
        files = {"file": ("a.wav", _claiming(wav, claimed))}
        response = client.post(
            "/v1/audio/transcriptions", files=files, data={"model": "whisper-tiny.en"}
        )
        assert "claims" in assert_error(response, 400, "invalid_audio")["message"]
    trailing = honest + b"TAG!" + (0xFFFF).to_bytes(4, "little")  # after the RIFF chunk
    for fine in (honest, trailing):
        response = client.post(
            "/v1/audio/transcriptions",
            files={"file": ("a.wav", fine)},
            data={"model": "whisper-tiny.en"},
        )
        assert response.status_code == 200, response.text


def test_transcription_of_a_wav_and_text_format(client: httpx.Client) -> None:
    files = {"file": ("a.wav", speech_like_wav(1.0))}
    response = client.post(
        "/v1/audio/transcriptions",
        files=files,
        data={"model": "whisper-tiny.en", "response_format": "text"},
    )
    assert response.status_code == 200
    assert response.text.strip() == "hello world"


def test_wrong_content_type_is_a_415(client: httpx.Client) -> None:
    response = client.post(
        "/v1/embeddings",
        content=b"input=x",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert_error(response, 415, "unsupported_media_type")
    response = client.post("/v1/audio/transcriptions", json={"model": "whisper-tiny.en"})
    assert_error(response, 415, "unsupported_media_type")


def test_malformed_json_is_a_400(client: httpx.Client) -> None:
    response = client.post(
        "/v1/chat/completions", content=b'{"model": ', headers={"content-type": "application/json"}
    )
    assert_error(response, 400, "invalid_json")
    headers = {"content-type": "application/json"}
    deep = client.post("/v1/chat/completions", content=b"[" * 50_000, headers=headers)
    assert_error(deep, 400, "invalid_json")
    huge_int = b'{"model": "x", "seed": ' + b"9" * 5000 + b"}"
    assert_error(client.post("/v1/chat/completions", content=huge_int, headers=headers), 400)


def test_a_seed_outside_int64_is_refused(client: httpx.Client) -> None:
    body = {"model": CHAT_MODEL, "seed": 2**64, "messages": [{"role": "user", "content": "hi"}]}
    error = assert_error(client.post("/v1/chat/completions", json=body), 400)
    assert "seed" in error["message"]


def test_stop_sequences_reach_the_stage_and_are_checked(client: httpx.Client) -> None:
    chat = {"model": CHAT_MODEL, "max_tokens": 12, "messages": [{"role": "user", "content": "x"}]}
    answer = client.post("/v1/chat/completions", json={**chat, "stop": [" cat"]}).json()
    assert answer["choices"][0]["message"]["content"] == "The image shows a"
    assert answer["choices"][0]["finish_reason"] == "stop"
    one = client.post("/v1/chat/completions", json={**chat, "stop": " shows"}).json()
    assert one["choices"][0]["message"]["content"] == "The image"
    for bad in (["a", "b", "c", "d", "e"], [""], "", 7):
        error = assert_error(client.post("/v1/chat/completions", json={**chat, "stop": bad}), 400)
        assert "stop" in error["message"]


def test_missing_field_names_it(client: httpx.Client) -> None:
    error = assert_error(client.post("/v1/embeddings", json={"model": EMBED_MODEL}), 400)
    assert error["param"] == "input"


def test_unknown_model_is_a_404(client: httpx.Client) -> None:
    error = assert_error(
        client.post("/v1/embeddings", json={"model": "gpt-9", "input": "x"}),
        404,
        "model_not_found",
    )
    assert EMBED_MODEL in error["message"]


def test_unknown_route_and_method(client: httpx.Client) -> None:
    assert_error(client.post("/v1/nothing", json={}), 404, "unknown_route")
    assert_error(client.get("/v1/nothing"), 404, "unknown_route")
    wrong_method = client.get("/v1/chat/completions")
    assert_error(wrong_method, 405, "method_not_allowed")
    assert wrong_method.headers["allow"] == "POST"


def test_policy_routes_are_served_and_listed(client: httpx.Client) -> None:
    document = client.get("/openapi.json").json()
    paths = document["paths"]
    assert "/v1/nothing" not in paths
    chat = paths["/v1/chat/completions"]["post"]
    schema = chat["requestBody"]["content"]["application/json"]["schema"]
    assert "messages" in schema["required"]
    assert "$ref" not in json.dumps(schema)  # inlined: no dangling $defs
    assert all("422" not in op["responses"] for ops in paths.values() for op in ops.values())
    upload = paths["/v1/audio/transcriptions"]["post"]["requestBody"]["content"]
    assert upload["multipart/form-data"]["schema"]["required"] == ["file", "model"]


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/v1/embeddings", {"model": EMBED_MODEL, "input": "a\ud800b"}, "input"),
        (
            "/v1/chat/completions",
            {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "x\udfffy"}]},
            "messages.0.content",
        ),
        ("/v1/pipelines/image_question", {"inputs": {"text": "\ud800"}}, "inputs.text"),
        ("/embed", {"texts": ["ok", "\udbff"]}, "texts.1"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(
    client: httpx.Client, route: str, body: dict[str, Any], param: str
) -> None:
    # json.dumps writes the lone surrogate as the escape \ud800: valid JSON, invalid Unicode
    raw = json.dumps(body).replace("\\\\u", "\\u")
    assert "\\ud" in raw
    response = client.post(route, content=raw, headers={"content-type": "application/json"})
    error = assert_error(response, 400, "invalid_value")
    assert error["param"] == param
    assert "surrogate" in error["message"]
    again = client.post("/embed", json={"texts": ["a"]})
    assert again.status_code == 200, again.text  # the same keep-alive connection still serves


def test_booleans_are_not_numbers(client: httpx.Client) -> None:
    body = {"model": CHAT_MODEL, "max_tokens": True, "messages": [{"role": "user", "content": "x"}]}
    error = assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_value")
    assert error["param"] == "max_tokens"


def test_unknown_pipeline_is_a_404(client: httpx.Client) -> None:
    error = assert_error(client.post("/v1/pipelines/nope", json={}), 404, "unknown_pipeline")
    assert "image_question" in error["message"]


def test_pipeline_missing_input_is_a_400(client: httpx.Client) -> None:
    response = client.post("/v1/pipelines/image_question", json={"inputs": {"text": "hi"}})
    assert_error(response, 400, "missing_input")


def test_pipeline_runs_levels(client: httpx.Client) -> None:
    image = base64.b64encode(photo_png(3)).decode()
    response = client.post(
        "/v1/pipelines/image_question",
        json={"inputs": {"image": image}, "prompt": "What does it say?", "max_tokens": 4},
    )
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    assert outputs["ocr"]["text"] == "HELLO"
    assert outputs["vision_encode"]["labels"][0]["label"] == "tabby cat"
    assert outputs["llm_generate"]["text"]


def test_feature_cache_counts_hits(client: httpx.Client) -> None:
    image = base64.b64encode(photo_png(77)).decode()
    for _ in range(2):
        assert client.post("/vision", json={"image_b64": image}).status_code == 200
    metrics = client.get("/metrics").text
    assert 'hetero_cache_hits_total{stage="vision_encode"}' in metrics


def test_peer_routes_shapes(client: httpx.Client) -> None:
    body = client.post("/embed", json={"texts": ["a", "b"]}).json()
    assert len(body["embeddings"]) == 2 and len(body["embeddings"][0]) == 384
    image = base64.b64encode(photo_png(5)).decode()
    body = client.post("/vision", json={"image_b64": image}).json()
    assert len(body["embedding"]) == 1280 and body["top1"] == 0


def test_oversized_body_is_a_413(client: httpx.Client) -> None:
    big = "word " * (5 * 2**20)
    response = client.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": big})
    assert_error(response, 413, "request_too_large")


def test_oversized_chunked_body_is_a_413(client: httpx.Client) -> None:
    def chunks() -> Any:
        for _ in range(30):
            yield b"x" * 2**20

    response = client.post(
        "/v1/embeddings", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_error(response, 413, "request_too_large")


def test_disconnect_mid_stream_leaves_the_server_serving(client: httpx.Client) -> None:
    body = {
        "model": CHAT_MODEL,
        "stream": True,
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "tell me a story"}],
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # leave after the first event: the connection closes mid-stream
    body["stream"] = False
    body["max_tokens"] = 3
    again = client.post("/v1/chat/completions", json=body)
    assert again.status_code == 200
    assert again.json()["choices"][0]["message"]["content"]


# --- auth, QoS and sensitive stages (a policy with keys) -----------------------------------


@pytest.fixture(scope="module")
def keyed(keyed_server: ServerThread) -> Any:
    with httpx.Client(base_url=keyed_server.url, timeout=30) as http:
        yield http


def test_missing_and_wrong_keys_are_401(keyed: httpx.Client) -> None:
    body = {"model": EMBED_MODEL, "input": "hello"}
    assert_error(keyed.post("/v1/embeddings", json=body), 401, "missing_api_key")
    wrong = {"Authorization": "Bearer sk-wrong"}
    assert_error(keyed.post("/v1/embeddings", json=body, headers=wrong), 401, "invalid_api_key")
    ok = keyed.post("/v1/embeddings", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200
    assert keyed.get("/health").status_code == 200


def test_unknown_qos_class_is_a_400(keyed: httpx.Client) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}", "X-Hetero-QoS": "platinum"}
    response = keyed.post(
        "/v1/embeddings", json={"model": EMBED_MODEL, "input": "x"}, headers=headers
    )
    assert_error(response, 400, "invalid_qos_class")


def test_sensitive_stage_gate_denies_and_masks(keyed: httpx.Client) -> None:
    image = base64.b64encode(photo_png(9)).decode()
    body = {"inputs": {"image": image}, "max_tokens": 2}
    denied = keyed.post(
        "/v1/pipelines/image_question", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
    )
    error = assert_error(denied, 403, "access_denied")
    assert "alice may not read ocr" in error["message"]
    allowed = keyed.post(
        "/v1/pipelines/image_question",
        json=body,
        headers={"Authorization": f"Bearer {REVIEWER_KEY}"},
    )
    assert allowed.status_code == 200, allowed.text


def test_output_token_limit(keyed: httpx.Client) -> None:
    body = {"model": CHAT_MODEL, "max_tokens": 1000, "messages": [{"role": "user", "content": "x"}]}
    response = keyed.post(
        "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
    )
    error = assert_error(response, 400)
    assert error["param"] == "max_tokens"


def test_limit_on_body_from_policy(keyed: httpx.Client) -> None:
    response = keyed.post(
        "/v1/embeddings",
        json={"model": EMBED_MODEL, "input": "x" * 300000},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert_error(response, 413)


# --- fuzz ----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "robot", 3]),
        "content": st.one_of(st.text(max_size=40), st.none(), json_values),
    }
)
chat_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from([CHAT_MODEL, "nope", 1])},
    optional={
        "messages": st.lists(message, max_size=3) | json_values,
        "stream": st.booleans() | json_values,
        "max_tokens": st.integers(-5, 80) | json_values,
        "temperature": st.floats(-1, 3, allow_nan=False),
        "n": st.integers(0, 3),
    },
)
embed_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from([EMBED_MODEL, "nope"])},
    optional={
        "input": st.text(max_size=30) | st.lists(st.text(max_size=20), max_size=5) | json_values,
        "encoding_format": st.sampled_from(["float", "base64", "hex"]),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    route_body=st.one_of(
        st.tuples(st.just("/v1/chat/completions"), chat_bodies),
        st.tuples(st.just("/v1/embeddings"), embed_bodies),
        st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/embeddings"]), json_values),
    )
)
def test_fuzzed_bodies_never_5xx(client: httpx.Client, route_body: tuple[str, Any]) -> None:
    route, body = route_body
    response = client.post(
        route, content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = set(response.json()["error"])
        assert error == {"message", "type", "param", "code", "request_id"}


def _png_header(width: int, height: int) -> bytes:
    """A PNG that is only its header: enough for any decoder to read the size."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def test_a_huge_image_is_too_large_not_undecodable(client: httpx.Client) -> None:
    image = base64.b64encode(_png_header(20_000, 20_000)).decode()
    error = assert_error(client.post("/vision", json={"image_b64": image}), 400, "image_too_large")
    assert "400000000 pixels" in error["message"] and error["param"] == "image_b64"
    modest = base64.b64encode(_png_header(9_000, 9_000)).decode()  # over our limit only
    error = assert_error(client.post("/vision", json={"image_b64": modest}), 400, "image_too_large")
    assert "9000x9000" in error["message"]
