"""GPUs as Ray resources, on a real local cluster whose worker gives Ray two **fake GPUs**
(``num_gpus=2``: no GPU here, so the two are Ray's count only). The devices hetero runs on them
are the sim backend's two simulated A100s (modelled runs, no outputs), lent by a node agent
that adds them on a node with GPUs (:class:`FakeGpuAgent`, a fake). Hetero's device actors
hold the GPUs they use (``num_gpus=1`` each; Ray sets each one's ``CUDA_VISIBLE_DEVICES``), so
a plain Ray task asking for a GPU waits until the engine closes. Run by ``make test-ray``.
Placement groups (a model over two GPUs) are not built: docs/cluster.md."""

from __future__ import annotations

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
from test_ray_cluster import node_args, short
from test_self_healing import GRAPHS

FAKE_GPUS = ("sim:a100-0", "sim:a100-1")  # the default sim fleet's two A100s
POLICY = """\
version: 1
devices: {{allow: [sim]}}
cluster: {{engine: ray, address: "{address}", heartbeat_s: 0.5}}
stages:
  encode:
    modality: text
    variants:
      full: {{flops_per_item: 1 MFLOPS, bytes_per_item: 10 kB, resident_bytes: 1 MB,
             max_batch: 1, max_delay_ms: 1}}
pipelines:
  one: {{steps: [{{stage: encode}}]}}
routes: {{/one: one}}
scheduler: {{placement: round_robin}}
qos:
  default_class: standard
  classes: {{standard: {{weight: 1, sla_tier: t, queue_bound: 1024}}}}
sla_tiers: {{t: {{deadline_ms: 120000}}}}
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head with no GPU and a worker with two fake GPUs, lending hetero its two sim A100s."""
    cluster = Cluster(initialize_head=True, head_node_args=node_args())
    cluster.add_node(**{**node_args(*FAKE_GPUS), "num_gpus": 2})
    cluster.wait_for_nodes()
    yield cluster
    disconnect()
    ray.shutdown()
    cluster.shutdown()


class FakeGpuAgent(NodeAgent):
    """A node agent that also lends the sim backend's A100s on a node that gives Ray GPUs (a
    fake: the real agent leaves simulated devices out of a node's discovery)."""

    def devices(self) -> Any:
        found = super().devices()
        here = ray.get_runtime_context().get_node_id()
        (node,) = [n for n in ray.nodes() if n["NodeID"] == here]
        if node["Resources"].get("GPU", 0):
            sim = self._backend("sim")
            found += [
                (d, frozenset(f for f in GraphFormat if sim.accepts(f, d.id)))
                for d in sim.devices()
                if d.id in FAKE_GPUS
            ]
        return found


@ray.remote(num_gpus=1)
def plain_gpu_task() -> list[str]:
    """Another Ray job's work that asks for a GPU."""
    return [str(gpu) for gpu in ray.get_gpu_ids()]


def test_device_actors_hold_their_gpus_so_a_plain_gpu_task_waits(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_cluster, "NodeAgent", FakeGpuAgent)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    worker = short(str(next(iter(cluster.worker_nodes)).node_id))
    on_gpus = {f"{gpu}@{worker}" for gpu in FAKE_GPUS}
    policy = load_policy_text(POLICY.format(address=cluster.address), "gpus.yaml")
    x = np.ones((2, 16), np.float32)
    try:
        with Engine(policy, default_registry(), {"encode/full": GRAPHS["encode/full"]}) as engine:
            assert ray.available_resources().get("GPU") == 2  # the control: none held yet
            results = [engine.submit("/one", {"x": x}).result(timeout=120) for _ in range(6)]
            assert {r.devices["encode"] for r in results} == on_gpus  # both fake GPUs ran
            assert ray.available_resources().get("GPU", 0) == 0  # hetero holds both
            assigned = []
            for device in sorted(on_gpus):
                gpus, visible = ray.get(engine.models[device].actor.gpu_ids.remote())
                assert visible == ",".join(gpus)  # Ray set the actor's CUDA_VISIBLE_DEVICES
                assigned += gpus
            assert sorted(assigned) == ["0", "1"]  # one each, none shared
            waiting = plain_gpu_task.remote()
            ready, _ = ray.wait([waiting], timeout=5)
            assert not ready  # no GPU is free for it while hetero holds them
        # closing the engine ends its actors and gives the GPUs back: the task runs
        assert ray.get(waiting, timeout=120) in (["0"], ["1"])
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
