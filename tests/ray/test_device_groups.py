"""A model over two GPUs, in a placement group, on a real local cluster whose worker gives Ray
two **fake GPUs** (``num_gpus=2``: Ray's count only, no GPU here). The policy groups the
worker's two GPU devices (``cluster.device_groups``); the devices are the sim backend's two
simulated A100s (modelled runs), lent by the fake node agent of ``test_gpu_resources.py``, so
the group ``sim:a100-0+1`` is a **fake-GPU stand-in** for ``vllm:cuda:0+1`` (vLLM itself, with
``tensor_parallel_size=2``, is not run here). Also: a device actor that no front door touches
for longer than its lease ends itself (the lease reaper). Run by ``make test-ray``."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster

from hetero.framework.cluster import ray_cluster
from hetero.framework.cluster.actor_link import DOOR_LEASE_MIN_S
from hetero.framework.cluster.device_groups import placement_name
from hetero.framework.cluster.lane_actor import LaneActor
from hetero.framework.cluster.lane_start import actor_name
from hetero.framework.cluster.ray_cluster import disconnect
from hetero.framework.engine import Engine
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import default_registry

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import test_gpu_resources
from test_gpu_resources import FAKE_GPUS, POLICY, FakeGpuAgent, plain_gpu_task
from test_membership import next_report, reports
from test_ray_cluster import node_args, short, until
from test_self_healing import GRAPHS

HERE = pathlib.Path(__file__).parent
GROUPED = POLICY.replace(
    "heartbeat_s: 0.5}}", 'heartbeat_s: 0.5, device_groups: {{"sim:a100": 2}}}}'
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head with no GPU and a worker with two fake GPUs, lending hetero its two sim A100s."""
    cluster = Cluster(initialize_head=True, head_node_args=node_args())
    cluster.add_node(**{**node_args(*FAKE_GPUS), "num_gpus": 2})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="hetero")  # the policies' namespace
    yield cluster
    disconnect()
    ray.shutdown()
    cluster.shutdown()


def placements(name: str) -> list[dict[str, Any]]:
    """Every placement group named ``name`` the GCS lists (removed ones too)."""
    return [pg for pg in ray.util.placement_group_table().values() if pg["name"] == name]


def placement_state(name: str) -> dict[str, Any] | None:
    """The placement group named ``name`` that is not removed, else a removed one (None:
    never made)."""
    found = sorted(placements(name), key=lambda pg: pg["state"] == "REMOVED")
    return found[0] if found else None


def test_a_two_gpu_model_runs_in_a_placement_group_that_holds_both_gpus(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_cluster, "NodeAgent", FakeGpuAgent)
    ray.cloudpickle.register_pickle_by_value(test_gpu_resources)
    worker = str(next(iter(cluster.worker_nodes)).node_id)
    group = f"sim:a100-0+1@{short(worker)}"
    policy = load_policy_text(GROUPED.format(address=cluster.address), "groups.yaml")
    x = np.ones((2, 16), np.float32)
    try:
        with Engine(policy, default_registry(), {"encode/full": GRAPHS["encode/full"]}) as engine:
            # the two GPUs are one fleet device; neither is a device of its own any more
            fleet = {d.id for d in engine.fleet.devices}
            assert group in fleet
            assert not {f"{gpu}@{short(worker)}" for gpu in FAKE_GPUS} & fleet
            (spec,) = [d for d in engine.fleet.devices if d.id == group]
            assert spec.properties["device_group"] == 2
            assert ray.available_resources().get("GPU") == 2  # the control: none held yet
            results = [engine.submit("/one", {"x": x}).result(timeout=120) for _ in range(4)]
            assert {r.devices["encode"] for r in results} == {group}  # answered by the group
            # its placement group: two one-GPU bundles, packed on the worker, holding both
            table = placement_state(placement_name(group))
            assert table is not None and table["state"] == "CREATED"
            assert table["strategy"] == "STRICT_PACK"
            assert [b["GPU"] for b in table["bundles"].values()] == [1.0, 1.0]
            assert set(table["bundles_to_node_id"].values()) == {worker}
            assert ray.available_resources().get("GPU", 0) == 0
            # the device's actor runs inside it and sees both GPUs
            actor = engine.models[group].actor
            assert ray.get(actor.placement_id.remote()) == table["placement_group_id"]
            gpus, visible = ray.get(actor.gpu_ids.remote())
            assert sorted(gpus) == ["0", "1"] and visible == ",".join(gpus)
            waiting = plain_gpu_task.remote()
            ready, _ = ray.wait([waiting], timeout=5)
            assert not ready  # no GPU is free for another job while the group holds them
        # closing the engine removes the placement group: the GPUs are free, the task runs
        assert ray.get(waiting, timeout=120) in (["0"], ["1"])
        removed = placement_state(placement_name(group))
        assert removed is not None and removed["state"] == "REMOVED"
    finally:
        ray.cloudpickle.unregister_pickle_by_value(test_gpu_resources)


def alive(name: str) -> bool:
    try:
        ray.get_actor(name, namespace="hetero-reap")
    except ValueError:
        return False
    return True


def test_an_actor_no_front_door_touches_for_its_lease_ends_itself(cluster: Cluster) -> None:
    """The lease reaper: a front door that died never leaves; its actor must not hold its
    device (a GPU) until ``ray stop``. The control, touched all the while, lives on."""
    lanes = ray.remote(LaneActor)
    made = {
        name: lanes.options(
            name=name, namespace="hetero-reap", lifetime="detached", num_cpus=0
        ).remote("sim:a100-0", name, lease_s=2.0)
        for name in ("forgotten", "touched")
    }
    started = time.monotonic()  # before the first touch: each lease runs from its own touch
    for actor in made.values():
        ray.get(actor.touch.remote("a front door"))
    # only "touched" hears from its front door; "forgotten"'s door died after its first touch
    assert until(
        lambda: ray.get(made["touched"].touch.remote("a front door")) and not alive("forgotten"),
        timeout_s=60,
    )
    assert time.monotonic() - started >= 2.0  # not before its lease ran out
    assert alive("touched")
    ray.kill(made["touched"])


def test_a_crashed_last_front_door_leaves_no_actor_holding_the_gpus(cluster: Cluster) -> None:
    """The front door that made the group's actor and placement group is SIGKILLed (it never
    leaves): once its lease runs out the actor ends itself and removes its placement group,
    so the GPUs are free again without ``ray stop``. The control: while the door lives and
    touches the actor, longer than a lease, the GPUs stay held."""
    worker = str(next(iter(cluster.worker_nodes)).node_id)
    group = f"sim:a100-0+1@{short(worker)}"
    door = subprocess.Popen(
        [sys.executable, str(HERE / "gpu_front_door.py"), cluster.address],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines = reports(door)
        # its heartbeat has kept the actor past a lease (10 s), and it still holds the GPUs
        report = next_report(lines, lambda r: r["up_s"] > 2 * DOOR_LEASE_MIN_S, 300)
        assert report["device"] == group
        assert ray.available_resources().get("GPU", 0) == 0
        door.send_signal(signal.SIGKILL)
        door.wait(timeout=30)
    finally:
        if door.poll() is None:
            door.kill()
            door.wait(timeout=30)
    # nothing closes it: its lease runs out, and it ends itself and its placement group
    assert until(lambda: ray.available_resources().get("GPU", 0) == 2, timeout_s=120)
    removed = placement_state(placement_name(group))
    assert removed is not None and removed["state"] == "REMOVED"
    assert not alive_named(actor_name(group))


def alive_named(name: str) -> bool:
    try:
        ray.get_actor(name, namespace="hetero")
    except ValueError:
        return False
    return True
