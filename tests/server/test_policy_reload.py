"""Policy hot reload through the admin endpoint, on fake stages run by the real engine: a
bounded mixed load (8 clients, 320 requests) with a reload in the middle fails nothing, and
every request sent after the reload answered is served by the new policy; a broken file or a
change that needs a restart is refused and the old policy keeps serving; a request in flight
keeps the policy it started with."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerThread
from fakes import FAKE_STAGES
from starlette.types import Receive, Scope, Send

from hetero.framework.policy import builtin_policy_text, load_policy
from hetero.framework.samples import photo_png
from hetero.framework.server import Serving, create_app, hash_key
from hetero.framework.server.reload import PinPolicy, PolicyReloader, changed_paths

ADMIN_KEY = "sk-test-admin"
USER_KEY = "sk-test-user"


def policy_text(name: str, max_tokens: int = 32, deadline_ms: int | None = None) -> str:
    text = builtin_policy_text("default").replace(
        "  allow: [cpu, npu]\n", "  allow: [cpu, npu]\n  deny: [dummy]\n"
    )
    text = text.replace("name: default\n", f"name: {name}\n")
    assert f"name: {name}\n" in text
    if deadline_ms is not None:
        assert "gold: {deadline_ms: 2000}" in text
        text = text.replace("gold: {deadline_ms: 2000}", f"gold: {{deadline_ms: {deadline_ms}}}")
    return text + (
        "\nserver:\n"
        "  api_keys:\n"
        f"    - {{name: ops, sha256: {hash_key(ADMIN_KEY)}, roles: [admin]}}\n"
        f"    - {{name: app, sha256: {hash_key(USER_KEY)}, roles: [analyst]}}\n"
        f"  limits: {{max_output_tokens: {max_tokens}}}\n"
    )


def load_policy_text_spec(text: str) -> Any:
    from hetero.framework.policy import load_policy_text

    return load_policy_text(text, "probe").spec


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Path]]:
    folder = tmp_path_factory.mktemp("reload")
    path = folder / "policy.yaml"
    path.write_text(policy_text("reload-a"))
    runtime = Serving(load_policy(path), stage_models=FAKE_STAGES, cache_directory=folder / "cache")
    runtime.start()
    with ServerThread(create_app(runtime)) as server:
        yield server, path
    runtime.close()


def _reload(url: str, key: str = ADMIN_KEY) -> httpx.Response:
    return httpx.post(
        f"{url}/admin/policy/reload", headers={"authorization": f"Bearer {key}"}, timeout=60
    )


def _policy_name(url: str) -> str:
    auth = {"authorization": f"Bearer {USER_KEY}"}
    return str(httpx.get(f"{url}/v1/devices", headers=auth, timeout=60).json()["policy"])


def _one(client: httpx.Client, index: int) -> tuple[int, str]:
    """One request of the mix: (status, the policy name it was served under, or "")."""
    auth = {"authorization": f"Bearer {USER_KEY}"}
    kind = index % 4
    if kind == 0:
        answer = client.post(
            "/v1/embeddings",
            json={"model": "all-minilm-l6-v2", "input": [f"sentence {index}", "another"]},
            headers=auth,
        )
    elif kind == 1:
        answer = client.post(
            "/v1/chat/completions",
            json={
                "model": "smollm2-135m-instruct",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": f"hello {index}"}],
            },
            headers=auth,
        )
    elif kind == 2:
        image = base64.b64encode(photo_png(seed=index % 7)).decode()
        answer = client.post("/v1/image/describe", json={"image": image}, headers=auth)
    else:
        answer = client.get("/v1/devices", headers=auth)
        return answer.status_code, str(answer.json()["policy"])
    return answer.status_code, ""


def test_a_reload_under_mixed_load_fails_no_request(
    served: tuple[ServerThread, Path],
) -> None:
    server, path = served
    total, clients = 320, 8
    halfway = threading.Event()
    reloaded = threading.Event()
    done = 0
    lock = threading.Lock()
    results: list[tuple[bool, int, str]] = []  # (sent after the reload answered, status, name)

    def client_loop(first: int) -> None:
        nonlocal done
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for index in range(first, total, clients):
                after = reloaded.is_set()
                status, name = _one(client, index)
                with lock:
                    results.append((after, status, name))
                    done += 1
                    if done == total // 3:
                        halfway.set()

    path.write_text(policy_text("reload-b", max_tokens=48, deadline_ms=2500))
    with ThreadPoolExecutor(clients) as pool:
        running = [pool.submit(client_loop, first) for first in range(clients)]
        assert halfway.wait(600)
        answer = _reload(server.url)
        reloaded.set()
        for future in running:
            future.result()
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert report["policy"] == "reload-b"
    assert set(report["changed"]) == {
        "name",
        "server.limits.max_output_tokens",
        "sla_tiers.gold.deadline_ms",
    }
    assert len(results) == total
    failed = [(after, status) for after, status, _ in results if status != 200]
    assert failed == []
    after_names = {name for after, _, name in results if after and name}
    assert after_names == {"reload-b"}  # nothing sent after the switch saw the old policy
    assert {name for after, _, name in results if not after and name} <= {"reload-a", "reload-b"}
    # the new limit is what requests are judged by: 40 tokens was over the old limit of 32
    chat = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={
            "model": "smollm2-135m-instruct",
            "max_tokens": 40,
            "messages": [{"role": "user", "content": "hi"}],
        },
        headers={"authorization": f"Bearer {USER_KEY}"},
        timeout=60,
    )
    assert chat.status_code == 200, chat.text


def test_a_broken_file_is_refused_with_its_line_and_the_old_policy_serves(
    served: tuple[ServerThread, Path],
) -> None:
    server, path = served
    good = path.read_text()
    before = _policy_name(server.url)
    lines = good.splitlines()
    number = next(i for i, line in enumerate(lines, 1) if "max_output_tokens" in line)
    lines[number - 1] = lines[number - 1].replace("max_output_tokens", "max_output_tokenz")
    path.write_text("\n".join(lines) + "\n")
    try:
        answer = _reload(server.url)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["code"] == "policy_invalid"
        assert f"{path}:{number}" in error["message"]
        assert "max_output_tokenz" in error["message"]
        assert _policy_name(server.url) == before
    finally:
        path.write_text(good)


def test_a_change_that_needs_a_restart_is_refused(served: tuple[ServerThread, Path]) -> None:
    server, path = served
    good = path.read_text()
    before = _policy_name(server.url)
    assert "modality: audio\n" in good
    path.write_text(good.replace("modality: audio\n", "modality: video\n"))
    try:
        answer = _reload(server.url)
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"]["code"] == "restart_required"
        assert "stages.asr.modality" in answer.json()["error"]["message"]
        assert _policy_name(server.url) == before
    finally:
        path.write_text(good)


def test_only_an_admin_key_may_reload(served: tuple[ServerThread, Path]) -> None:
    server, _ = served
    assert _reload(server.url, USER_KEY).status_code == 403
    anonymous = httpx.post(f"{server.url}/admin/policy/reload", timeout=60)
    assert anonymous.status_code in (401, 403)
    assert _reload(server.url).status_code == 200  # control: the admin key may


def test_a_request_in_flight_keeps_its_policy(tmp_path: Path) -> None:
    """A reload that happens while a request runs: that request still reads the old policy,
    the next one the new (PinPolicy, without timing: the reload runs inside the request)."""
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text("old"))
    runtime = Serving(load_policy(path), stage_models=FAKE_STAGES)
    reloader = PolicyReloader(runtime, type("State", (), {})(), _Counter())
    seen: list[tuple[str, str]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        before = runtime.spec.name
        if not seen:
            path.write_text(policy_text("new"))
            reloader.reload()
        seen.append((before, runtime.spec.name))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    from fastapi.testclient import TestClient

    client = TestClient(PinPolicy(app, runtime))
    client.get("/")
    client.get("/")
    assert seen == [("old", "old"), ("new", "new")]
    assert runtime.current_policy.spec.name == "new"


class _Counter:
    def labels(self, *args: str) -> _Counter:
        return self

    def inc(self, amount: float = 1.0) -> None:
        pass


def test_changed_paths_name_each_key() -> None:
    old = load_policy_text_spec(policy_text("a"))
    new = load_policy_text_spec(policy_text("b", max_tokens=40))
    assert list(changed_paths(old, old)) == []
    assert set(changed_paths(old, new)) == {"name", "server.limits.max_output_tokens"}
