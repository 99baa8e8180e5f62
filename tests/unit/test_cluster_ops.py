"""The cluster parts of ``/ready`` and ``/metrics``: a front door whose cluster lost its head is
not ready (503, with the reason), and a device actor's restarts are a Prometheus counter.

The engine and its cluster backend are named fakes (no Ray in this venv): the backend answers
``unreachable()`` and ``actor_restarts()`` as :class:`~hetero.framework.cluster.ray_cluster.
RayBackend` does; ``make test-ray`` checks the real one against a cluster whose head is
killed (tests/ray/test_head_loss.py) and whose device actor is killed
(tests/ray/test_self_healing.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest

from hetero.framework.server.ops_metrics import ClusterCollector, cluster_unreachable
from hetero.framework.server.routes_ops import router


class FakeClusterBackend:
    """What the Ray backend reports (a fake: no cluster here)."""

    def __init__(self) -> None:
        self.lost: str | None = None
        self.restarts = {"npu:onnxruntime/CPUExecutionProvider@node-1234abcd": 2}

    def unreachable(self) -> str | None:
        return self.lost

    def actor_restarts(self) -> dict[str, int]:
        return dict(self.restarts)


class EmbeddedBackend:
    """A backend of one process: no cluster to lose."""


def fake_runtime(backends: dict[str, Any]) -> Any:
    engine = SimpleNamespace(backends=backends)
    return SimpleNamespace(
        engine=engine,
        ready=True,
        loading=False,
        load_s=1.0,
        stage_states=lambda: {"encode": {"state": "ready"}},
    )


def client_for(runtime: Any) -> TestClient:
    app = FastAPI()
    app.include_router(router)
    app.state.runtime = runtime
    return TestClient(app)


def test_ready_is_503_with_the_reason_once_the_cluster_head_is_lost() -> None:
    backend = FakeClusterBackend()
    client = client_for(fake_runtime({"npu": EmbeddedBackend(), "ray": backend}))
    assert client.get("/ready").status_code == 200  # the control: the head answers
    backend.lost = "the Ray cluster's head (GCS) has not answered for 7 s"
    answer = client.get("/ready")
    assert answer.status_code == 503
    body = answer.json()
    assert body["ready"] is False and body["status"] == "unavailable"
    assert body["cluster"] == backend.lost
    backend.lost = None  # the head is back: ready again
    assert client.get("/ready").status_code == 200


def test_embedded_mode_has_no_cluster_to_lose() -> None:
    runtime = fake_runtime({"npu": EmbeddedBackend()})
    assert cluster_unreachable(runtime.engine) is None
    assert cluster_unreachable(None) is None  # no engine yet
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: runtime.engine))
    assert b"hetero_device_actor_restarts" not in generate_latest(registry)


def test_metrics_count_device_actor_restarts_and_say_whether_the_head_answers() -> None:
    backend = FakeClusterBackend()
    runtime = fake_runtime({"ray": backend})
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: runtime.engine))
    device = "npu:onnxruntime/CPUExecutionProvider@node-1234abcd"
    assert registry.get_sample_value("hetero_device_actor_restarts_total", {"device": device}) == 2
    assert registry.get_sample_value("hetero_cluster_reachable") == 1
    backend.restarts[device] = 3
    backend.lost = "gone"
    assert registry.get_sample_value("hetero_device_actor_restarts_total", {"device": device}) == 3
    assert registry.get_sample_value("hetero_cluster_reachable") == 0
