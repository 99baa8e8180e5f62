"""The shipped Grafana dashboard and alert rules against a real Prometheus (Debian's
``prometheus`` 2.42, installed by tools/sysdeps.sh): Prometheus scrapes a running hetero (fake
stages run by the real engine) every second while a short mixed load runs, and every query of
every dashboard panel returns data through Prometheus's HTTP API; ``promtool check rules`` and
the rules' unit tests pass."""

from __future__ import annotations

import base64
import json
import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import ServerThread, default_with_peer_routes, free_port
from fakes import FAKE_STAGES

from hetero.framework.samples import photo_png
from hetero.framework.server import Serving, create_app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "hetero-dashboard.json"
RULES = DEPLOY / "prometheus" / "hetero-alerts.yml"
WAIT_S = 180.0  # upper bound for Prometheus to have scraped what the load left; not a pace


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (tools/sysdeps.sh test installs 'prometheus')")
    return found


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel of the shipped dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


@pytest.fixture(scope="module")
def hetero(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    runtime = Serving(
        default_with_peer_routes(),
        stage_models=FAKE_STAGES,
        cache_directory=tmp_path_factory.mktemp("dashboard-cache"),
    )
    runtime.start()
    with ServerThread(create_app(runtime)) as server:
        yield server
    runtime.close()


@pytest.fixture(scope="module")
def prometheus(hetero: ServerThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = _binary("prometheus")
    folder = tmp_path_factory.mktemp("prometheus")
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{RULES}]\n"
        "scrape_configs:\n"
        "  - job_name: hetero\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{hetero.port}']}}]\n"
    )
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(folder / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: _get(f"{url}/-/ready") == 200, "Prometheus ready", process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _get(url: str) -> int:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return 0


def _wait_for(condition: Any, what: str, process: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``condition`` until it holds, at most WAIT_S (a bound, not a pace)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if process is not None and process.poll() is not None:
            pytest.fail(f"{what}: prometheus exited with {process.returncode}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {WAIT_S:g} s")
        time.sleep(0.25)


def _drive_load(url: str, rounds: int) -> None:
    """A short mix, with repeats (cache hits) and a few client errors (the errors panel)."""
    with httpx.Client(base_url=url, timeout=60) as client:
        for index in range(rounds):
            texts = [f"sentence {index % 4}", "the same sentence"]
            answers = [
                client.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": texts}),
                client.post(
                    "/v1/image/describe",
                    json={"image": base64.b64encode(photo_png(seed=index % 3)).decode()},
                ),
                client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "smollm2-135m-instruct",
                        "max_tokens": 4,
                        "messages": [{"role": "user", "content": f"hi {index}"}],
                    },
                ),
            ]
            assert [a.status_code for a in answers] == [200, 200, 200]
            bad = client.post(
                "/v1/embeddings", content=b"{", headers={"content-type": "application/json"}
            )
            assert bad.status_code == 400


def _finite(url: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=30).json()
    assert answer["status"] == "success", (expr, answer)
    return [r for r in answer["data"]["result"] if math.isfinite(float(r["value"][1]))]


def test_every_dashboard_panel_has_data(prometheus: str, hetero: ServerThread) -> None:
    queries = panel_queries()
    assert len(queries) >= 15
    # Prometheus scrapes hetero before and after the load: rates need two scrapes around it
    _wait_for(lambda: _finite(prometheus, 'up{job="hetero"} == 1') != [], "first scrape")
    # A labelled series appears at its first use, and a rate needs two scrapes of it: a first
    # round creates every series, Prometheus scrapes them, then the second round moves them.
    _drive_load(hetero.url, rounds=2)
    created = "sum(hetero_cache_hits_total) > 0 and sum(hetero_queue_wait_seconds_count) > 0"
    _wait_for(lambda: _finite(prometheus, created) != [], "the first round scraped")
    _drive_load(hetero.url, rounds=12)
    scraped = httpx.get(f"{hetero.url}/metrics", timeout=30).text
    assert "hetero_requests_total" in scraped
    missing: dict[str, str] = {}

    def all_have_data() -> bool:
        missing.clear()
        for title, expr in queries:
            if not _finite(prometheus, expr):
                missing[title] = expr
        return not missing

    deadline = time.monotonic() + WAIT_S
    while not all_have_data():
        assert time.monotonic() < deadline, f"panels without data: {missing}"
        time.sleep(0.5)
    # the devices placed and the tiers hit are the ones hetero reports, not just any series
    placed = {r["metric"]["device"] for r in _finite(prometheus, queries_by_title()["placed"])}
    assert placed and all(":" in device for device in placed)
    tiers = {r["metric"]["tier"] for r in _finite(prometheus, queries_by_title()["tiers"])}
    assert "memory" in tiers
    rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=30).json()["data"]["groups"]
    assert {rule["health"] for group in rules for rule in group["rules"]} == {"ok"}


def queries_by_title() -> dict[str, str]:
    by_title = dict(panel_queries())
    return {
        "placed": by_title["Placements per second by device"],
        "tiers": by_title["Cache hit rate by tier"] + " > 0",
    }


def test_promtool_checks_the_alert_rules() -> None:
    promtool = _binary("promtool")
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout
    tested = subprocess.run(
        [promtool, "test", "rules", "hetero-alerts.test.yml"],
        cwd=RULES.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}
    assert {
        "HeteroErrorBudgetFastBurn",
        "HeteroBreakerOpen",
        "HeteroQueueGrowing",
        "HeteroSandboxDown",
    } <= alerts
