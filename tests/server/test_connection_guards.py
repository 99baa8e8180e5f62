"""What a client cannot do to the server by how it connects: hold connections open with a
request trickled byte by byte, or reach a loopback server from a web page (DNS rebinding, a
cross-site form). Each check carries its control: the same request done right is served."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator

import httpx
import pytest
from conftest import ServerThread, default_with_peer_routes
from fakes import FAKE_STAGES
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hetero.framework.server import Serving, create_app
from hetero.framework.server.protocol import guarded

SAFETY_S = 30  # only if the server never answers: the test then fails, it never waits on time


@pytest.fixture(scope="module", params=[HttpToolsProtocol, H11Protocol], ids=["httptools", "h11"])
def guarded_server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    policy = default_with_peer_routes(
        "header_timeout_s: 0.5, body_timeout_s: 0.5, max_header_bytes: 4 KiB"
    )
    runtime = Serving(policy, stage_models=FAKE_STAGES, cache_directory=tempfile.mkdtemp())
    runtime.start()
    limits = policy.spec.server.limits
    with ServerThread(
        create_app(runtime),
        http=guarded(request.param, limits.header_timeout_s, limits.max_header_bytes),
    ) as server:
        yield server
    runtime.close()


def raw(server: ServerThread, data: bytes) -> bytes:
    """Send ``data`` and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=SAFETY_S) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_a_request_head_trickled_slowly_loses_its_connection(guarded_server: ServerThread) -> None:
    assert raw(guarded_server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ") == b""
    served = raw(
        guarded_server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    assert served.startswith(b"HTTP/1.1 200")


def test_a_request_head_over_the_limit_is_a_431_and_the_control_under_it_is_served(
    guarded_server: ServerThread,
) -> None:
    def head(size: int) -> bytes:
        start = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Big: "
        return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"

    refused = raw(guarded_server, head(5 * 1024))
    assert refused.startswith(b"HTTP/1.1 431"), refused[:200]
    assert b'"code":"headers_too_large"' in refused
    served = raw(guarded_server, head(3 * 1024))
    assert served.startswith(b"HTTP/1.1 200"), served[:200]


def test_a_body_that_does_not_arrive_is_a_408(guarded_server: ServerThread) -> None:
    head = (
        b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: 40\r\n\r\n"
    )
    answer = raw(guarded_server, head + b'{"texts": ["a"')
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    body = b'{"texts": ["a"]}'
    complete = head.replace(b"40", str(len(body)).encode()) + body
    assert raw(guarded_server, complete).startswith(b"HTTP/1.1 200")


def test_dns_rebinding_and_cross_site_posts_are_refused(guarded_server: ServerThread) -> None:
    with httpx.Client(base_url=guarded_server.url, timeout=SAFETY_S) as http:
        rebound = http.get("/health", headers={"Host": "evil.example:8000"})
        assert rebound.status_code == 421
        assert rebound.json()["error"]["code"] == "misdirected_request"
        assert http.get("/health", headers={"Host": "localhost:8000"}).status_code == 200
        form = {"file": ("a.wav", b"RIFF", "audio/wav")}
        cross = http.post(
            "/v1/speech/transcribe", files=form, headers={"Origin": "https://evil.example"}
        )
        assert cross.status_code == 403
        assert cross.json()["error"]["code"] == "origin_not_allowed"
        own = http.post("/embed", json={"texts": ["a"]}, headers={"Origin": guarded_server.url})
        assert own.status_code == 200
        assert http.post("/embed", json={"texts": ["a"]}).status_code == 200  # API clients


def _status_count(server: ServerThread, status: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=SAFETY_S).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("hetero_requests_total{") and f'status="{status}"' in line
    )


def test_a_client_leaving_mid_body_logs_one_line(
    guarded_server: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    before = _status_count(guarded_server, "499")
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 400\r\n\r\n"
    )
    with caplog.at_level("INFO"):
        with socket.create_connection(("127.0.0.1", guarded_server.port), timeout=SAFETY_S) as sock:
            sock.sendall(head + b'{"model": "all-minilm-l6-v2", "input": "a')
        for _ in range(1000):  # until the server has counted it (each look is a request)
            if _status_count(guarded_server, "499") > before:
                break
    assert _status_count(guarded_server, "499") == before + 1
    left = [r for r in caplog.records if "left before sending its whole body" in r.getMessage()]
    assert len(left) == 1
    assert not [r for r in caplog.records if r.exc_info or r.levelname in ("ERROR", "CRITICAL")]
