"""The engine on a real Ray cluster of two nodes on loopback (``ray.cluster_utils.Cluster``),
each node's agent discovering its devices through the npu backend (OpenVINO and ONNX Runtime on
the CPU), real ONNX graphs run on the nodes. Run by ``make test-ray`` in its own venv."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import wait
from typing import Any

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster

from hetero.framework.cluster.ray_cluster import RAY_BACKEND, connect, disconnect
from hetero.framework.engine import Engine
from hetero.framework.fleet import resolve_fleet
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import default_registry

RNG = np.random.default_rng(5)
W1 = RNG.standard_normal((16, 32)).astype(np.float32)
W2 = RNG.standard_normal((32, 4)).astype(np.float32)
OBJECT_STORE = 80 * 2**20

POLICY = """\
version: 1
devices: {{allow: [npu]}}
cluster: {{engine: ray, address: "{address}"}}
stages:
  encode:
    modality: text
    variants:
      full: {{flops_per_item: 1 MFLOPS, bytes_per_item: 10 kB, resident_bytes: 4 kB,
             max_batch: 8, max_delay_ms: 1}}
  head:
    modality: embedding
    variants:
      full: {{flops_per_item: 1 MFLOPS, bytes_per_item: 10 kB, resident_bytes: 1 kB,
             max_batch: 8, max_delay_ms: 1}}
pipelines:
  two: {{steps: [{{stage: encode}}, {{stage: head}}]}}
routes: {{/two: two}}
scheduler: {{placement: round_robin}}
circuit_breaker:
  device: {{window: 4, min_calls: 2, error_rate: 0.5, open_s: 60}}
qos:
  default_class: standard
  classes: {{standard: {{weight: 1, sla_tier: t, queue_bound: 256}}}}
sla_tiers: {{t: {{deadline_ms: 60000}}}}
"""


def matmul_graph(name: str, weight: np.ndarray, src: str, dst: str, relu: bool) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat

    nodes = [helper.make_node("MatMul", [src, "w"], ["mm" if relu else dst])]
    if relu:
        nodes.append(helper.make_node("Relu", ["mm"], [dst]))
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(src, TensorProto.FLOAT, ["N", weight.shape[0]])],
        [helper.make_tensor_value_info(dst, TensorProto.FLOAT, ["N", weight.shape[1]])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    hint = BandwidthHint(flops_per_item=2 * weight.size, bytes_per_item=4 * weight.size)
    return ComputeGraph(name, GraphFormat.ONNX, model.SerializeToString(), hint, input_names=(src,))


GRAPHS = {
    "encode/full": matmul_graph("encode", W1, "x", "h", relu=True),
    "head/full": matmul_graph("head", W2, "h", "y", relu=False),
}


def expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W1, 0) @ W2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two nodes (the head and a worker), one cluster for the whole module."""
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": OBJECT_STORE},
    )
    cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE)
    cluster.wait_for_nodes()
    yield cluster
    disconnect()
    ray.shutdown()
    cluster.shutdown()


def wait_until_dead(agent: Any) -> None:
    """Call the agent until a call fails as Ray fails calls to a dead actor (each call answers
    at once while it lives; no sleeping)."""
    for _ in range(100_000):
        try:
            ray.get(agent.resident.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            return
    raise AssertionError("the removed node's agent kept answering")


def head_id(cluster: Cluster) -> str:
    return str(cluster.head_node.node_id)


def node_of(device_id: str) -> str:
    return device_id.rsplit("@", 1)[1]


def run_all(engine: Engine, count: int) -> list[Any]:
    inputs = [RNG.standard_normal((2, 16)).astype(np.float32) for _ in range(count)]
    futures = [engine.submit("/two", {"x": x}) for x in inputs]
    wait(futures)
    results = [future.result() for future in futures]
    for x, result in zip(inputs, results, strict=True):
        np.testing.assert_allclose(result.outputs["head"]["y"], expected(x), rtol=1e-4, atol=1e-4)
    return results


def test_hetero_devices_lists_every_node_of_the_cluster(
    cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    policy = tmp_path / "cluster.yaml"
    policy.write_text(POLICY.format(address=cluster.address))
    hetero = pathlib.Path(sys.executable).with_name("hetero")
    result = subprocess.run(
        [str(hetero), "devices", "--policy", str(policy), "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    devices = json.loads(result.stdout)["devices"]
    nodes = {d["properties"]["node_id"] for d in devices}
    assert nodes == {str(n.node_id) for n in [cluster.head_node, *cluster.worker_nodes]}
    assert {d["properties"]["node_backend"] for d in devices} == {"npu"}


def test_one_fleet_across_nodes_survives_a_node_lost_and_takes_a_node_that_joins(
    cluster: Cluster,
) -> None:
    policy = load_policy_text(POLICY.format(address=cluster.address), "cluster.yaml")
    registry = default_registry()
    fleet = resolve_fleet(policy, registry)
    nodes = {node_of(d.id) for d in fleet.devices}
    assert len(nodes) == 2, [d.id for d in fleet.devices]  # every node's devices, one fleet
    assert {d.backend for d in fleet.devices} == {RAY_BACKEND}
    assert {d.host for d in fleet.devices} == nodes  # the network lies between nodes
    (head,) = {node_of(d.id) for d in fleet.devices if d.properties["node_id"] == head_id(cluster)}
    (worker,) = nodes - {head}

    with Engine(policy, registry, GRAPHS) as engine:
        # Round robin over four devices of two nodes: both nodes serve.
        served = run_all(engine, 16)
        assert {node_of(d) for r in served for d in r.devices.values()} == nodes

        # The worker node dies while the scheduler still counts on it, and the head's devices
        # are held out of placement: the next wave is dispatched to the dead node's devices.
        (worker_node,) = list(cluster.worker_nodes)
        cluster.remove_node(worker_node, allow_graceful=False)
        dead_agent = connect(policy.spec.cluster).agent(worker_node.node_id)
        wait_until_dead(dead_agent)  # its worker process outlives the raylet by a moment
        head_devices = [d.id for d in fleet.devices if node_of(d.id) == head]
        with engine._lock:
            for device_id in head_devices:
                engine.scheduler.set_health(device_id, False)
            placed = len(engine.scheduler.decisions)
        survivors = run_all(engine, 8)  # no request lost: each is retried on the head node
        first_tries: dict[int, str] = {}
        for decision in list(engine.scheduler.decisions)[placed:]:
            if decision.stage == "encode":
                first_tries.setdefault(decision.task_id, decision.device_id)
        # The first request was placed while only the dead node's devices were in placement
        # (later ones may already see the head's back: the first failure re-reads health).
        assert node_of(first_tries[min(first_tries)]) == worker
        retries = engine.metrics.registry.get_sample_value(
            "hetero_stage_retries_total", {"stage": "encode"}
        )
        assert retries is not None and retries >= 1
        assert all(node_of(d) == head for r in survivors for d in r.devices.values())
        lost = [d.id for d in fleet.devices if node_of(d.id) == worker]
        backend = engine.backends[RAY_BACKEND]
        assert all("left the cluster" in (backend.health(d) or "") for d in lost)
        assert not any(engine.scheduler.healthy[engine.scheduler.fleet.index[d]] for d in lost)

        # A node joins: its agent reports its devices and the running engine places on them.
        cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE)
        cluster.wait_for_nodes()
        joined = connect(policy.spec.cluster).refresh()
        assert joined and len({node_of(d.id) for d in joined}) == 1
        engine.add_devices(joined)
        fresh = node_of(joined[0].id)
        after = run_all(engine, 16)
        assert fresh in {node_of(d) for r in after for d in r.devices.values()}
