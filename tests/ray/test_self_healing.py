"""Self-healing of the Ray mode on a real two-node cluster on loopback (a head lending its
OpenVINO CPU device, a worker lending its ONNX Runtime one): a device actor that dies on a
live node is restarted and warmed, and its device readmitted, without the node counting as
lost, and ``/metrics`` counts the restart; a final output kept by an actor that died is made
again, not a failed request; a device call that hangs times out, the breaker counts it, and
the request is answered elsewhere; a joining node whose device discovery hangs blocks nothing
and joins when it answers; a joining node is warmed before it takes work. Run by ``make
test-ray``."""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, wait
from typing import Any

import numpy as np
import pytest
import ray
from prometheus_client import CollectorRegistry
from ray.cluster_utils import Cluster

from hetero.framework.cluster import ray_cluster
from hetero.framework.cluster.agent import NodeAgent
from hetero.framework.cluster.ray_cluster import RAY_BACKEND, disconnect
from hetero.framework.cluster.remote_lanes import RayModelHost
from hetero.framework.cluster.stand_ins import KeptBatch
from hetero.framework.engine import Engine
from hetero.framework.engine.graph_stage import GraphStage
from hetero.framework.policy import Policy, load_policy_text
from hetero.framework.registry import default_registry
from hetero.framework.scheduler.breakers import BreakerState
from hetero.framework.server.ops_metrics import ClusterCollector
from hetero.framework.stage_plugin import GraphRunner

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_ray_cluster import (  # the cluster's shapes, one source
    ONNXRUNTIME,
    OPENVINO,
    matmul_graph,
    node_args,
    short,
    until,
)

POLICY = """\
version: 1
devices: {{allow: [npu]}}
cluster: {{engine: ray, address: "{address}", heartbeat_s: 0.5, call_timeout_s: {timeout}}}
stages:
  encode:
    modality: text
    variants:
      full: {{flops_per_item: 1 MFLOPS, bytes_per_item: 10 kB, resident_bytes: 1 MB,
             max_batch: 4, max_delay_ms: 1}}
pipelines:
  one: {{steps: [{{stage: encode}}]}}
routes: {{/one: one}}
scheduler: {{placement: round_robin}}
circuit_breaker:
  device: {{window: {window}, min_calls: {min_calls}, error_rate: 0.5, open_s: 600}}
qos:
  default_class: standard
  classes: {{standard: {{weight: 1, sla_tier: t, queue_bound: 1024}}}}
sla_tiers: {{t: {{deadline_ms: 120000}}}}
"""
RNG = np.random.default_rng(11)
# 128 KiB outputs per request: kept in the device actor that made them until the front door
# fetches them, so a killed actor takes unread final outputs with it (made again)
WIDE = 16_384
W1 = RNG.standard_normal((16, WIDE)).astype(np.float32)
GRAPHS = {"encode/full": matmul_graph("encode", W1, "x", "h", relu=True)}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """The head (OpenVINO) and one worker (ONNX Runtime)."""
    cluster = Cluster(initialize_head=True, head_node_args=node_args(OPENVINO))
    cluster.add_node(**node_args(ONNXRUNTIME))
    cluster.wait_for_nodes()
    yield cluster
    disconnect()
    ray.shutdown()
    cluster.shutdown()


def policy_for(cluster: Cluster, timeout_s: float, window: int, min_calls: int) -> Policy:
    return policy_at(cluster.address, timeout_s, window, min_calls)


def policy_at(address: str, timeout_s: float, window: int, min_calls: int) -> Policy:
    text = POLICY.format(address=address, timeout=timeout_s, window=window, min_calls=min_calls)
    return load_policy_text(text, "healing.yaml")


def restarts_on_metrics(engine: Engine, device: str) -> float | None:
    """``hetero_device_actor_restarts_total`` for ``device`` as ``/metrics`` shows it (the
    server's collector on the engine's registry)."""
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: engine))
    return registry.get_sample_value("hetero_device_actor_restarts_total", {"device": device})


def submit(engine: Engine, count: int) -> list[tuple[np.ndarray, Future[Any]]]:
    inputs = [RNG.standard_normal((2, 16)).astype(np.float32) for _ in range(count)]
    return [(x, engine.submit("/one", {"x": x})) for x in inputs]


def settle(submitted: list[tuple[np.ndarray, Future[Any]]]) -> list[Any]:
    """Every request's result, checked (none may fail)."""
    wait([future for _, future in submitted])
    results = [future.result() for _, future in submitted]
    for (x, _), result in zip(submitted, results, strict=True):
        np.testing.assert_allclose(
            result.outputs["encode"]["h"], np.maximum(x @ W1, 0), rtol=1e-3, atol=1e-3
        )
    return results


def test_a_killed_device_actor_restarts_warm_and_its_device_takes_work_again(
    cluster: Cluster,
) -> None:
    # a breaker that a few failed in-flight batches do not open
    policy = policy_for(cluster, timeout_s=60, window=40, min_calls=20)
    worker = short(str(next(iter(cluster.worker_nodes)).node_id))
    on_worker = f"{ONNXRUNTIME}@{worker}"
    with Engine(policy, default_registry(), {"encode/full": GRAPHS["encode/full"]}) as engine:
        first = settle(submit(engine, 8))  # round robin: both devices serve
        assert on_worker in {r.devices["encode"] for r in first}
        host = engine.models[on_worker]
        assert isinstance(host, RayModelHost)
        actor = host.actor
        assert restarts_on_metrics(engine, on_worker) == 0
        pid = ray.get(actor.pid.remote())
        in_flight = submit(engine, 40)
        ray.kill(actor, no_restart=False)  # the process dies; Ray restarts the actor
        killed = time.monotonic()
        later = submit(engine, 40)
        settle(in_flight + later)  # 0 failed: every request answered, each output right
        backend = engine.backends[RAY_BACKEND]
        # the device is back once its actor restarted and took its stage and model again
        assert until(lambda: host.restarts == 1 and backend.health(on_worker) is None, 60)
        back_s = time.monotonic() - killed
        print(f"\nkilled actor's device readmitted after {back_s:.1f} s")
        assert restarts_on_metrics(engine, on_worker) == 1  # /metrics shows the restart
        assert host.actor is actor  # restarted by Ray: the same named actor, a new process
        assert ray.get(actor.pid.remote()) != pid
        assert ray.get(actor.resident.remote("encode/full"))  # warmed before readmission
        # a lost node would have taken the device out for good, with "left" as the reason
        assert all("left" not in (backend.health(d.id) or "") for d in engine.fleet.devices)
        for _ in range(200):  # the device takes work again
            wave = settle(submit(engine, 4))
            if any(r.devices["encode"] == on_worker for r in wave):
                break
        else:
            raise AssertionError("the restarted device never took work again")


def test_a_final_output_kept_by_an_actor_that_died_is_made_again(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The front door's first fetch of a kept final output finds its actor killed (the fault
    injected at that moment: the kill, then the fetch): the step runs again and the request
    is answered; the control (the requests before) fetch theirs at once."""
    policy = policy_for(cluster, timeout_s=60, window=40, min_calls=20)
    killed: list[str] = []
    real_pick = KeptBatch.pick

    def pick_after_a_kill(batch: KeptBatch, picks: list[tuple[int, str | None]]) -> list[Any]:
        if not killed:
            killed.append(batch.device_id)
            handle = batch.handle()
            pid = ray.get(handle.pid.remote())
            ray.kill(handle, no_restart=False)
            assert until(lambda: _pid_gone(pid), 30)  # the keeping process is gone
        return real_pick(batch, picks)

    with Engine(policy, default_registry(), {"encode/full": GRAPHS["encode/full"]}) as engine:
        settle(submit(engine, 4))  # the control: kept outputs fetched, nothing lost
        retried = _retries(engine)
        monkeypatch.setattr(KeptBatch, "pick", pick_after_a_kill)
        (result,) = settle(submit(engine, 1))  # answered, the output right (0 failed)
        monkeypatch.undo()
        assert killed, "no kept output was fetched"
        assert _retries(engine) == retried + 1  # made again once
        host = engine.models[killed[0]]
        assert isinstance(host, RayModelHost)
        assert until(lambda: host.restarts == 1, 60)
        assert restarts_on_metrics(engine, killed[0]) == 1
        failed = engine.metrics.registry.get_sample_value(
            "hetero_engine_requests_total", {"route": "/one", "outcome": "failed"}
        )
        assert not failed
        print(f"\nfinal output lost on {killed[0]}, made again on {result.devices['encode']}")


def _retries(engine: Engine) -> float:
    value = engine.metrics.registry.get_sample_value(
        "hetero_stage_retries_total", {"stage": "encode"}
    )
    return value or 0.0


def _pid_gone(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class HangingStage(GraphStage):
    """``encode`` whose runs on one node hang (sleep) while a flag file exists."""

    def __init__(self, node_id: str, flag: pathlib.Path) -> None:
        super().__init__("encode", {"full": GRAPHS["encode/full"]})
        self.node_id = node_id
        self.flag = str(flag)

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        here = ray.get_runtime_context().get_node_id()
        if here == self.node_id and pathlib.Path(self.flag).exists():
            time.sleep(30)  # a hung device: longer than the call timeout
        return super().run(runner, variant, payloads)


def test_a_hanging_device_call_times_out_opens_the_breaker_and_loses_nothing(
    cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    policy = policy_for(cluster, timeout_s=2, window=4, min_calls=2)
    worker_node = next(iter(cluster.worker_nodes))
    on_worker = f"{ONNXRUNTIME}@{short(str(worker_node.node_id))}"
    flag = tmp_path / "hang"
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        stage = HangingStage(str(worker_node.node_id), flag)
        with Engine(policy, default_registry(), plugins={"encode": stage}) as engine:
            settle(submit(engine, 8))  # the control: both devices serve, nothing hangs
            flag.touch()
            breaker = engine.scheduler.breaker("encode", on_worker)
            results: list[Any] = []
            for _ in range(20):  # waves until the worker's timeouts open its breaker
                results += settle(submit(engine, 4))  # 0 lost: the hung ones ran elsewhere
                if breaker.state is BreakerState.OPEN:
                    break
            assert breaker.state is BreakerState.OPEN
            assert all(r.devices["encode"] != on_worker for r in results)
            # a timeout is the breaker's business, not a lost node or a dead actor
            assert engine.backends[RAY_BACKEND].health(on_worker) is None
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


class HangingAgent(NodeAgent):
    """A node agent whose discovery hangs on nodes not in ``known`` while ``flag`` exists (a
    hung GPU driver), at most ``HANG_LIMIT_S``."""

    known: frozenset[str] = frozenset()
    flag = ""

    def devices(self) -> Any:
        here = ray.get_runtime_context().get_node_id()
        limit = time.monotonic() + HANG_LIMIT_S
        while here not in self.known and pathlib.Path(self.flag).exists():
            if time.monotonic() > limit:
                break
            time.sleep(0.1)
        return super().devices()


HANG_LIMIT_S = 120.0


def test_a_node_whose_discovery_hangs_blocks_nothing_and_joins_once_it_answers(
    cluster: Cluster, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = policy_for(cluster, timeout_s=60, window=40, min_calls=20)
    flag = tmp_path / "hang"
    flag.touch()
    HangingAgent.known = frozenset(n["NodeID"] for n in ray.nodes() if n["Alive"])
    HangingAgent.flag = str(flag)
    monkeypatch.setattr(ray_cluster, "NodeAgent", HangingAgent)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    joined = None
    try:
        with Engine(policy, default_registry(), GRAPHS) as engine:
            settle(submit(engine, 4))
            joined = cluster.add_node(**node_args(ONNXRUNTIME))
            cluster.wait_for_nodes()
            fresh = short(str(joined.node_id))
            connection = ray_cluster.connect(policy.spec.cluster)
            # the heartbeat's refresh returns while the node's discovery hangs (it would
            # wait for HANG_LIMIT_S before), and the engine serves on
            assert connection.refresh() == []
            wave = settle(submit(engine, 8))
            assert all(not r.devices["encode"].endswith(fresh) for r in wave)
            assert not [d for d in engine.fleet.devices if d.id.endswith(fresh)]
            flag.unlink()  # the driver answers: the node joins and takes work
            for _ in range(10_000):
                wave = settle(submit(engine, 4))
                if any(r.devices["encode"].endswith(fresh) for r in wave):
                    break
            else:
                raise AssertionError("the node never joined")
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        flag.unlink(missing_ok=True)
        if joined is not None:
            cluster.remove_node(joined)
