"""Zero-downtime model version swaps, through the admin reload on a real server whose
``text_embed`` stage is the real all-MiniLM-L6-v2 model (the other stages are fakes, run by the
same engine): the new version loads beside the old, is probed, takes the traffic, and the old
one drains and unloads.

Switch point, all at once: the moment ``POST /admin/policy/reload`` answers 200; every
embedding request SENT after that must be answered by the new version. Canary: the request
that answers the canary's last counted request; every later one is the new version's. Each
response names the version that answered in its ``X-Hetero-Stages`` entry (``model_version``).

Test doubles of broken models (real TextEmbedder code, so they load the real model): one whose
every run raises (fails its probe), one that answers only its probe (fails in the canary).
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServerThread
from fakes import FAKE_STAGES

from hetero.framework.errors import ExecutionError
from hetero.framework.policy import builtin_policy_text, load_policy
from hetero.framework.samples import photo_png
from hetero.framework.server import Serving, create_app, hash_key
from hetero.framework.stage_plugin import GraphRunner
from hetero.models.embed import TextEmbedder

ADMIN_KEY = "sk-test-swap-admin"
USER_KEY = "sk-test-swap-user"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
USER = {"authorization": f"Bearer {USER_KEY}"}
FIRST_VERSION = "all-minilm-l6-v2@1"


class BrokenEmbedder(TextEmbedder):
    """Test double of a broken model version: every run raises (so its probe fails)."""

    model_ids = ("broken-minilm",)

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        raise ExecutionError("cpu", "main", "test double: this model version is broken")


class ProbeOnlyEmbedder(TextEmbedder):
    """Test double of a model version that passes its probe and then fails every real
    request (a regression only traffic shows)."""

    model_ids = ("probe-only-minilm",)

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        probe = self.probe_payload()
        if all(list(p) == probe for p in payloads):
            return super().run(runner, variant, payloads)
        return [
            ExecutionError("cpu", "main", "test double: wrong output on real traffic")
            for _ in payloads
        ]


STAGE_MODELS = {
    **FAKE_STAGES,
    "text_embed": TextEmbedder,
    "broken-minilm": BrokenEmbedder,
    "probe-only-minilm": ProbeOnlyEmbedder,
}


def policy_text(version: str, rollout: str = "", name: str = "swap") -> str:
    text = builtin_policy_text("default").replace(
        "  allow: [cpu, npu]\n", "  allow: [cpu, npu]\n  deny: [dummy]\n"
    )
    line = f"    model_version: {FIRST_VERSION}\n"
    assert line in text
    text = text.replace(line, f"    model_version: {version}\n" + (rollout and f"    {rollout}\n"))
    text = text.replace("name: default\n", f"name: {name}\n")
    return text + (
        "\nserver:\n"
        "  api_keys:\n"
        f"    - {{name: ops, sha256: {hash_key(ADMIN_KEY)}, roles: [admin]}}\n"
        f"    - {{name: app, sha256: {hash_key(USER_KEY)}, roles: [analyst]}}\n"
        "  limits: {max_output_tokens: 16}\n"
        "  runtimes: {text_embed: onnxruntime}\n"  # one device: one warm-up per version
    )


@dataclass
class Swap:
    server: ServerThread
    runtime: Serving
    path: Path


@pytest.fixture(scope="module")
def swap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swap]:
    folder = tmp_path_factory.mktemp("swap")
    path = folder / "policy.yaml"
    path.write_text(policy_text(FIRST_VERSION))
    runtime = Serving(
        load_policy(path), stage_models=STAGE_MODELS, cache_directory=folder / "cache"
    )
    runtime.start()
    assert runtime.stages["text_embed"].plugin.__class__ is TextEmbedder
    with ServerThread(create_app(runtime)) as server:
        yield Swap(server, runtime, path)
    runtime.close()


def _reload(url: str) -> httpx.Response:
    return httpx.post(f"{url}/admin/policy/reload", headers=ADMIN, timeout=600)


def _settled(url: str) -> dict[str, Any]:
    """The rollouts once none is in progress (the endpoint waits on the swap's own events)."""
    answer = httpx.get(f"{url}/admin/rollouts", params={"wait_s": 300}, headers=ADMIN, timeout=400)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    assert body["idle"] is True
    return body


def _serving_version(url: str) -> str:
    stages = httpx.get(f"{url}/v1/devices", headers=USER, timeout=60).json()["stages"]
    return str(next(s["model_version"] for s in stages if s["stage"] == "text_embed"))


def _embed(client: httpx.Client, texts: list[str]) -> tuple[int, dict[str, Any]]:
    """(status, the text_embed entry of X-Hetero-Stages)."""
    answer = client.post(
        "/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": texts}, headers=USER
    )
    if answer.status_code != 200:
        return answer.status_code, {"error": answer.text}
    (entry,) = json.loads(answer.headers["x-hetero-stages"])
    return 200, entry


def _one(client: httpx.Client, index: int) -> tuple[int, str]:
    """One request of the mix: (status, the embedding version that answered, or "")."""
    kind = index % 4
    if kind in (0, 3):
        status, entry = _embed(client, [f"sentence number {index}", "a shared sentence"])
        return status, str(entry.get("model_version", ""))
    if kind == 1:
        answer = client.post(
            "/v1/chat/completions",
            json={
                "model": "smollm2-135m-instruct",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": f"hello {index}"}],
            },
            headers=USER,
        )
    else:
        image = base64.b64encode(photo_png(seed=index % 7)).decode()
        answer = client.post("/v1/image/describe", json={"image": image}, headers=USER)
    return answer.status_code, ""


def _load_with(
    url: str, act: Any, before: int, after_each: int, clients: int = 8
) -> tuple[Any, list[tuple[bool, int, str]]]:
    """Mixed requests from ``clients`` clients: once ``before`` have been answered, ``act()``
    runs (a reload) while they go on; each client stops once it has sent ``after_each``
    requests after act returned. Returns act's result and (sent after act returned, status,
    version) per request."""
    started = threading.Event()
    acted = threading.Event()
    lock = threading.Lock()
    results: list[tuple[bool, int, str]] = []

    def client_loop(first: int) -> None:
        sent_after = 0
        index = first
        with httpx.Client(base_url=url, timeout=300) as client:
            while sent_after < after_each:
                after = acted.is_set()
                status, version = _one(client, index)
                index += clients
                sent_after += after
                with lock:
                    results.append((after, status, version))
                    if len(results) >= before:
                        started.set()

    with ThreadPoolExecutor(clients) as pool:
        running = [pool.submit(client_loop, first) for first in range(clients)]
        assert started.wait(600)
        outcome = act()
        acted.set()
        for future in running:
            future.result()
    assert sum(after for after, _, _ in results) == clients * after_each
    return outcome, results


def _resident_stages(runtime: Serving) -> set[str]:
    assert runtime.engine is not None
    return {key.split("/", 1)[0] for keys in runtime.engine.resident().values() for key in keys}


def _rollouts_metric(url: str, outcome: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=60).text
    prefix = f'hetero_model_rollouts_total{{outcome="{outcome}",stage="text_embed"}} '
    found = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(found[0].split()[-1]) if found else 0.0


def test_a_swap_under_mixed_load_fails_nothing_and_the_old_version_never_answers_after_it(
    swap: Swap,
) -> None:
    url = swap.server.url
    old = _serving_version(url)
    new = old.split("@", 1)[0] + "@" + str(int(old.split("@", 1)[1]) + 1)
    promoted = _rollouts_metric(url, "promoted")
    swap.path.write_text(policy_text(new))
    answer, results = _load_with(url, lambda: _reload(url), before=96, after_each=24)
    assert len(results) >= 288
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert report["changed"] == ["stages.text_embed.model_version"]
    rollout = report["rollouts"]["text_embed"]
    assert (rollout["from"], rollout["to"], rollout["strategy"]) == (old, new, "all_at_once")
    assert rollout["state"] in ("draining", "done") and rollout["probe_s"] is not None
    assert [(after, status) for after, status, _ in results if status != 200] == []
    after = [version for sent_after, _, version in results if sent_after and version]
    before = [version for sent_after, _, version in results if not sent_after and version]
    assert after and set(after) == {new}  # nothing old after the switch point
    assert old in before  # control: the old version did serve before it
    assert _settled(url)["rollouts"]["text_embed"]["state"] == "done"
    assert _serving_version(url) == new
    resident = _resident_stages(swap.runtime)
    engine_name = swap.runtime.stages["text_embed"].engine_name
    assert engine_name == f"text_embed@{new}" and engine_name in resident
    old_engine_stages = {"text_embed", f"text_embed@{old}"}
    assert not resident & old_engine_stages  # the old version was unloaded everywhere
    assert _rollouts_metric(url, "promoted") == promoted + 1


def test_no_cache_entry_of_the_old_version_is_served_after_a_swap(swap: Swap) -> None:
    url = swap.server.url
    text = ["a sentence embedded before the swap, then asked again after it"]
    with httpx.Client(base_url=url, timeout=300) as client:
        _, first = _embed(client, text)
        _, again = _embed(client, text)
        old = first["model_version"]
        assert (first["cached"], again["cached"]) == (False, True)  # control: it is cached
        new = old.split("@", 1)[0] + "@" + str(int(old.split("@", 1)[1]) + 1)
        swap.path.write_text(policy_text(new))
        assert _reload(url).status_code == 200
        assert swap.runtime.engine is not None
        status = swap.runtime.engine.status[swap.runtime.stages["text_embed"].engine_name]
        batches = status.batches
        _, after = _embed(client, text)
        assert (after["model_version"], after["cached"]) == (new, False)
        assert status.batches == batches + 1  # the new version's model computed it
        _, later = _embed(client, text)
        assert (later["model_version"], later["cached"]) == (new, True)
    _settled(url)


def test_a_version_that_fails_its_probe_is_refused_and_nothing_fails(swap: Swap) -> None:
    url = swap.server.url
    old = _serving_version(url)
    good = swap.path.read_text()
    rolled_back = _rollouts_metric(url, "rolled_back")
    swap.path.write_text(policy_text("broken-minilm@1", name="swap-broken"))
    try:
        answer, results = _load_with(url, lambda: _reload(url), before=48, after_each=12)
    finally:
        swap.path.write_text(good)
    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert error["code"] == "rollout_failed"
    assert "stages.text_embed.model_version" in error["message"]
    assert "this model version is broken" in error["message"]
    assert [(after, status) for after, status, _ in results if status != 200] == []
    assert {version for _, _, version in results if version} == {old}
    body = httpx.get(f"{url}/v1/devices", headers=USER, timeout=60).json()
    assert body["policy"] == "swap"  # the whole reload was refused
    assert _serving_version(url) == old
    state = _settled(url)["rollouts"]["text_embed"]
    assert (state["to"], state["state"]) == ("broken-minilm@1", "rolled_back")
    assert not any(name.startswith("text_embed@broken") for name in _resident_stages(swap.runtime))
    assert _rollouts_metric(url, "rolled_back") == rolled_back + 1


def test_a_canary_gets_its_share_counted_and_then_takes_over(swap: Swap) -> None:
    url = swap.server.url
    old = _serving_version(url)
    new = old.split("@", 1)[0] + "@" + str(int(old.split("@", 1)[1]) + 1)
    rollout = "rollout: {strategy: canary, canary_share: 0.25, canary_s: 0, canary_min_requests: 5}"
    swap.path.write_text(policy_text(new, rollout))
    answer = _reload(url)
    assert answer.status_code == 200, answer.text
    assert answer.json()["rollouts"]["text_embed"]["state"] == "canary"
    versions = []
    with httpx.Client(base_url=url, timeout=300) as client:
        for index in range(30):
            status, entry = _embed(client, [f"canary sentence {index}"])
            assert status == 200, entry
            versions.append(entry["model_version"])
    # every 4th request goes to the canary until it answered 5 (the 20th), then all of them
    expected = [new if (k + 1) % 4 == 0 else old for k in range(20)] + [new] * 10
    assert versions == expected
    state = _settled(url)["rollouts"]["text_embed"]
    assert state["state"] == "done"
    assert (state["canary"]["routed_new"], state["canary"]["routed_old"]) == (5, 15)


def test_a_canary_that_fails_is_rolled_back_with_no_failed_request(swap: Swap) -> None:
    url = swap.server.url
    old = _serving_version(url)
    rolled_back = _rollouts_metric(url, "rolled_back")
    rollout = (
        "rollout: {strategy: canary, canary_share: 0.5, canary_s: 0, "
        "canary_min_requests: 100000, max_error_rate: 0.0}"
    )
    swap.path.write_text(policy_text("probe-only-minilm@1", rollout))
    answer, results = _load_with(url, lambda: _reload(url), before=48, after_each=12)
    assert answer.status_code == 200, answer.text  # it passed its probe
    assert [(after, status) for after, status, _ in results if status != 200] == []
    # the canary's failures were answered again by the old version
    assert {version for _, _, version in results if version} == {old}
    state = _settled(url)["rollouts"]["text_embed"]
    assert state["state"] == "rolled_back"
    assert state["canary"]["failed"] >= 1 and "canary requests failed" in state["reason"]
    assert _serving_version(url) == old
    assert not any(name.startswith("text_embed@probe") for name in _resident_stages(swap.runtime))
    assert _rollouts_metric(url, "rolled_back") == rolled_back + 1
    swap.path.write_text(policy_text(old))  # what serves, so later reloads start from it
