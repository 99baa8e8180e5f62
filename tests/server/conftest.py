"""Fixtures: an in-process app on fake stages (fast), and ONE real server on real models."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from hetero.framework.policy import Policy, load_policy, load_policy_text
from hetero.framework.server import Serving, create_app, hash_key

sys.path.insert(0, str(Path(__file__).parent))
from fakes import FAKE_STAGES

API_KEY = "sk-test-gold"
REVIEWER_KEY = "sk-test-reviewer"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerThread:
    """uvicorn serving ``app`` in a thread on a free loopback port."""

    def __init__(self, app: Any, http: Any = "auto") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", http=http
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.started_devices: dict[str, Any] = {}

    def __enter__(self) -> ServerThread:
        started = threading.Event()
        original = self.server.startup

        async def startup(*args: Any, **kwargs: Any) -> None:
            await original(*args, **kwargs)
            started.set()

        self.server.startup = startup  # type: ignore[method-assign]
        self.thread.start()
        assert started.wait(60), "uvicorn did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def default_with_peer_routes(limits: str = "") -> Policy:
    """The default policy, plus the peers harness's /embed and /vision routes, on this host's
    own devices (not the dummy plugin's fakes, which tests put on the path), with answers of at
    most 32 tokens (the API fuzzer may ask for any number the limit allows) and ``limits``
    (more ``server.limits`` keys, as YAML flow-mapping entries)."""
    from hetero.framework.policy import builtin_policy_text

    text = builtin_policy_text("default").replace(
        "  allow: [cpu, npu]\n", "  allow: [cpu, npu]\n  deny: [dummy]\n"
    )
    assert "deny: [dummy]" in text
    extra = f", {limits}" if limits else ""
    server = f"\nserver:\n  peer_routes: true\n  limits: {{max_output_tokens: 32{extra}}}\n"
    return load_policy_text(text + server, "default-peer-routes")


def keyed_policy(limits: str = "") -> Policy:
    """The default policy with two API keys and a sensitive OCR stage."""
    text = load_policy("builtin:default")
    from hetero.framework.policy import builtin_policy_text

    base = builtin_policy_text("default")
    del text
    extra = f"""
server:
  peer_routes: true
  api_keys:
    - name: alice
      sha256: {hash_key(API_KEY)}
      roles: [analyst]
      max_qos_class: interactive
    - name: bob
      sha256: {hash_key(REVIEWER_KEY)}
      roles: [reviewer]
      max_qos_class: batch
  limits:
    max_body_bytes: 200000
    max_output_tokens: 64
{limits}
partitions:
  id_cards:
    modality: image
    classification: confidential
    cipher: AES-256-GCM
    key: file:/nonexistent
    isolation: process
    roles: [reviewer]
"""
    base = base.replace(
        "    model_version: pp-ocrv4@1\n",
        "    model_version: pp-ocrv4@1\n    partition: id_cards\n",
    )
    return load_policy_text(base + extra, "keyed-test-policy")


class DenyAnalysts:
    """A gate that refuses the analyst role and masks digits."""

    def authorize(self, principal: Any, stage: str, request_id: str) -> None:
        if "reviewer" not in principal.roles:
            raise PermissionError(f"{principal.name} may not read {stage}")

    def mask(self, principal: Any, stage: str, value: Any) -> Any:
        return {**value, "text": "".join("*" if c.isdigit() else c for c in value["text"])}


class InProcessSandboxes:
    """A test double, NOT a sandbox: hands back the fake stage plugin itself (placed on the
    host's devices) so the HTTP layer's 401/403/masking can be tested without runc. The real
    provider is hetero.sandbox.serving.SandboxedStages (tests/integration/
    test_sandboxed_serving.py)."""

    def register_devices(self, registry: Any) -> None:
        pass

    def plugin(self, stage: str, kind: str) -> Any:
        return FAKE_STAGES[kind]()


@pytest.fixture(scope="session")
def fake_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    runtime = Serving(
        default_with_peer_routes(),
        stage_models=FAKE_STAGES,
        cache_directory=tmp_path_factory.mktemp("fake-cache"),
    )
    runtime.start()
    yield runtime
    runtime.close()


@pytest.fixture(scope="session")
def fake_server(fake_runtime: Serving) -> Iterator[ServerThread]:
    with ServerThread(create_app(fake_runtime)) as server:
        yield server


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    runtime = Serving(
        keyed_policy(),
        stage_models=FAKE_STAGES,
        gate=DenyAnalysts(),
        sandboxes=InProcessSandboxes(),
        cache_directory=tmp_path_factory.mktemp("keyed-cache"),
    )
    runtime.start()
    with ServerThread(create_app(runtime)) as server:
        yield server
    runtime.close()


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    from hetero.framework.registry import default_registry
    from hetero.framework.stage_plugin import stage_plugins

    found = stage_plugins(default_registry())
    kinds = {"vision_encode", "ocr", "asr", "tts", "text_embed", "llm_generate"}
    missing = sorted(kinds - set(found))
    if missing:
        pytest.fail(f"real model stages missing (make venv installs them): {missing}")
    runtime = Serving(
        default_with_peer_routes(), cache_directory=tmp_path_factory.mktemp("real-cache")
    )
    with ServerThread(create_app(runtime, registry=default_registry())) as server:
        runtime.start()
        # where warm-up placed each stage, before any test's traffic widens residency
        server.started_devices = httpx.get(f"{server.url}/v1/devices", timeout=60).json()
        yield server
    runtime.close()
