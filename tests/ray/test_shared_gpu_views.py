"""Devices that view one GPU (``cuda:0`` and ``vllm:cuda:0``) share it through one placement
group of that GPU, on a real local cluster whose worker gives Ray two **fake GPUs**
(``num_gpus=2``: Ray's count only). The worker lends four of the sim backend's simulated GPUs,
two of them views of the other two (``sim:h100-N`` serves ``sim:a100-N``: a **fake-GPU
stand-in** for ``vllm:cuda:N`` beside ``cuda:N``). Asked on the node for half a GPU each, Ray
packs fractions onto a GPU already partly used, so the views of two GPUs could all land on one;
in their GPU's placement group (one bundle: the whole GPU) each pair gets one GPU, and the two
pairs two. Run by ``make test-ray``."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster

from hetero.framework.cluster import ray_cluster
from hetero.framework.cluster.agent import NodeAgent
from hetero.framework.cluster.ray_cluster import disconnect
from hetero.framework.engine import Engine
from hetero.framework.graph import GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import default_registry

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_device_groups import placement_state
from test_gpu_resources import POLICY
from test_ray_cluster import node_args, short, until
from test_self_healing import GRAPHS

VIEWS = {
    "sim:a100-0": None,
    "sim:a100-1": None,
    "sim:h100-0": "sim:a100-0",
    "sim:h100-1": "sim:a100-1",
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head with no GPU and a worker with two fake GPUs, lending hetero four views of them."""
    cluster = Cluster(initialize_head=True, head_node_args=node_args())
    cluster.add_node(**{**node_args(*VIEWS), "num_gpus": 2})
    cluster.wait_for_nodes()
    yield cluster
    disconnect()
    ray.shutdown()
    cluster.shutdown()


class ViewsAgent(NodeAgent):
    """A node agent that lends the sim backend's A100s and H100s on a node that gives Ray GPUs,
    each H100 a view of the A100 of its index (a fake: ``serves``, as vLLM's devices say it)."""

    def devices(self) -> Any:
        found = super().devices()
        here = ray.get_runtime_context().get_node_id()
        (node,) = [n for n in ray.nodes() if n["NodeID"] == here]
        if node["Resources"].get("GPU", 0):
            sim = self._backend("sim")
            for d in sim.devices():
                if d.id in VIEWS:
                    formats = frozenset(f for f in GraphFormat if sim.accepts(f, d.id))
                    serves = VIEWS[d.id]
                    view = d
                    if serves:
                        view = dataclasses.replace(d, properties={**d.properties, "serves": serves})
                    found.append((view, formats))
        return found


def test_views_of_one_gpu_get_that_gpu_and_views_of_two_gpus_two(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_cluster, "NodeAgent", ViewsAgent)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    worker = short(str(next(iter(cluster.worker_nodes)).node_id))
    devices = {f"{view}@{worker}" for view in VIEWS}
    policy = load_policy_text(POLICY.format(address=cluster.address), "views.yaml")
    x = np.ones((2, 16), np.float32)
    try:
        with Engine(policy, default_registry(), {"encode/full": GRAPHS["encode/full"]}) as engine:
            assert ray.available_resources().get("GPU") == 2  # the control: none held yet
            results = [engine.submit("/one", {"x": x}).result(timeout=120) for _ in range(8)]
            assert {r.devices["encode"] for r in results} == devices  # all four ran
            gpu_of = {}
            for device in devices:
                gpus, visible = ray.get(engine.models[device].actor.gpu_ids.remote())
                assert len(gpus) == 1 and visible == gpus[0]
                gpu_of[device.split("@")[0]] = gpus[0]
            assert gpu_of["sim:a100-0"] == gpu_of["sim:h100-0"]  # one GPU, its two views
            assert gpu_of["sim:a100-1"] == gpu_of["sim:h100-1"]
            assert gpu_of["sim:a100-0"] != gpu_of["sim:a100-1"]  # two GPUs, one each
            names = [f"hetero-gpu:sim:a100-{i}@{worker}" for i in range(2)]
            for name in names:  # one placement group a GPU: one bundle, the whole GPU
                table = placement_state(name)
                assert table is not None and table["state"] == "CREATED"
                assert [b["GPU"] for b in table["bundles"].values()] == [1.0]
            assert ray.available_resources().get("GPU", 0) == 0
        # the last view of each GPU to leave removed its placement group: the GPUs are free
        for name in names:
            removed = placement_state(name)
            assert removed is not None and removed["state"] == "REMOVED"
        assert until(lambda: ray.available_resources().get("GPU", 0) == 2, timeout_s=60)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
