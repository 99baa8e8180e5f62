"""Forwarding headers are believed only from ``server.trusted_proxies`` (F4): by default a
local client rotating ``X-Forwarded-For`` is still one client to the failed-key throttle
(429 after 10 failures); with loopback named as a trusted proxy, the header is believed and
each forwarded address is its own client (the control). And the start-up warning for a
non-loopback listener that serves any Host."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
import uvicorn
from conftest import ServerThread
from fakes import FAKE_STAGES

from hetero.framework.policy import builtin_policy_text, load_policy_text
from hetero.framework.server import Serving, create_app, hash_key
from hetero.framework.server.listening import server_config, startup_warnings

KEY = "sk-proxy-test"


def _policy(trusted: str) -> Any:
    text = builtin_policy_text("default").replace(
        "  allow: [cpu, npu]\n", "  allow: [cpu, npu]\n  deny: [dummy]\n"
    )
    server = f"""
server:
  api_keys:
    - name: alice
      sha256: {hash_key(KEY)}
  trusted_proxies: {trusted}
"""
    return load_policy_text(text + server, "proxies")


def _statuses(trusted: str, tries: int) -> list[int]:
    policy = _policy(trusted)
    runtime = Serving(policy, stage_models=FAKE_STAGES, use_cache=False)
    runtime.start()
    try:
        thread = ServerThread(create_app(runtime))
        config = server_config(
            thread.server.config.app, policy.spec.server, "127.0.0.1", thread.port
        )
        thread.server = uvicorn.Server(config)  # as hetero serve runs it
        thread.thread = threading.Thread(target=thread.server.run, daemon=True)
        with thread:
            return [
                httpx.get(
                    f"{thread.url}/v1/models",
                    headers={
                        "authorization": f"Bearer wrong-{n}",
                        "x-forwarded-for": f"203.0.113.{n}",
                    },
                    timeout=30,
                ).status_code
                for n in range(tries)
            ]
    finally:
        runtime.close()


def test_a_rotating_forwarded_for_from_loopback_does_not_escape_the_throttle() -> None:
    statuses = _statuses("[]", 12)
    assert statuses[:10] == [401] * 10
    assert statuses[10:] == [429, 429]


def test_a_trusted_proxy_forwards_each_clients_address() -> None:
    assert _statuses("['127.0.0.1']", 12) == [401] * 12  # twelve clients, one failure each


@pytest.mark.parametrize(
    ("host", "allowed", "warned"),
    [("127.0.0.1", "[]", False), ("0.0.0.0", "[]", True), ("0.0.0.0", "[api.example]", False)],
)
def test_serving_any_host_off_loopback_is_warned_at_start(
    host: str, allowed: str, warned: bool
) -> None:
    text = builtin_policy_text("default") + f"\nserver:\n  allowed_hosts: {allowed}\n"
    server = load_policy_text(text, "hosts").spec.server
    warnings = startup_warnings(server, host)
    assert bool(warnings) is warned
    assert all("DNS rebinding" in w for w in warnings)
