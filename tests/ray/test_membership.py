"""Who serves a Ray cluster, on a real two-node cluster on loopback (a head lending its OpenVINO
CPU device, a worker lending its ONNX Runtime one): a node that joins mid-load takes work only
once its device is warm (no request waits for its cold start; the control, joining cold,
shows one that did); two front doors share one device actor per device, and a front door
killed mid-load loses only its own requests. Run by ``make test-ray``."""

from __future__ import annotations

import json
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from hetero.framework.cluster.joining import Joining
from hetero.framework.cluster.lane_start import actor_name
from hetero.framework.cluster.ray_cluster import connect, disconnect
from hetero.framework.engine import Engine
from hetero.framework.engine.graph_stage import GraphStage
from hetero.framework.registry import default_registry

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_ray_cluster import ONNXRUNTIME, OPENVINO, node_args, short  # the cluster's shapes
from test_self_healing import GRAPHS, policy_for, settle, submit

HERE = pathlib.Path(__file__).parent
SLOW_SETUP_S = 6.0  # a joining node's cold start of the stage (a model's load, a compile)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """The head (OpenVINO) and one worker (ONNX Runtime); a test adds a node."""
    cluster = Cluster(initialize_head=True, head_node_args=node_args(OPENVINO))
    cluster.add_node(**node_args(ONNXRUNTIME))
    cluster.wait_for_nodes()
    yield cluster
    disconnect()
    ray.shutdown()
    cluster.shutdown()


class SlowSetupStage(GraphStage):
    """``encode`` whose setup takes :data:`SLOW_SETUP_S` on nodes not in ``known``."""

    def __init__(self, known: frozenset[str]) -> None:
        super().__init__("encode", {"full": GRAPHS["encode/full"]})
        self.known = known

    def setup(self) -> None:
        if ray.get_runtime_context().get_node_id() not in self.known:
            time.sleep(SLOW_SETUP_S)  # the cold start being modelled
        super().setup()


def join_cold(self: Joining, devices: Any, peers: Any) -> None:
    """The control: a joining device handed to the engine at once, unwarmed (as before)."""
    with self._lock:
        self._ready.extend(devices)


@pytest.mark.parametrize("warm", [True, False], ids=["warmed", "control-cold"])
def test_a_node_joining_mid_load_takes_work_only_once_warm(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, warm: bool
) -> None:
    if not warm:
        monkeypatch.setattr(Joining, "start", join_cold)
    policy = policy_for(cluster, timeout_s=60, window=40, min_calls=20)
    connect(policy.spec.cluster)  # ray.init, as the engine would
    known = frozenset(n["NodeID"] for n in ray.nodes() if n["Alive"])
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    joined = None
    try:
        stage = SlowSetupStage(known)
        with Engine(policy, default_registry(), plugins={"encode": stage}) as engine:
            settle(submit(engine, 8))  # both devices warm and serving
            in_flight = submit(engine, 16)  # the load the node joins under
            joined = cluster.add_node(**node_args(ONNXRUNTIME))
            fresh = short(str(joined.node_id))
            results = settle(in_flight)
            deadline = time.monotonic() + 180
            while sum(r.devices["encode"].endswith(fresh) for r in results) < 4:
                assert time.monotonic() < deadline, "the joined node never took work"
                results += settle(submit(engine, 4))
        on_fresh = [r.latency_s for r in results if r.devices["encode"].endswith(fresh)]
        print(
            f"\nwarm={warm}: {len(results)} requests, the joined node's slowest "
            f"{max(on_fresh):.2f} s, everyone's slowest {max(r.latency_s for r in results):.2f} s"
        )
        if warm:  # none of its requests waited for its cold start
            assert max(on_fresh) < SLOW_SETUP_S
        else:  # the control: its first request did
            assert max(on_fresh) >= SLOW_SETUP_S
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        if joined is not None:
            cluster.remove_node(joined)


def reports(door: subprocess.Popen[str]) -> queue.Queue[dict[str, Any]]:
    """The other front door's JSON lines, as they come (read by a thread)."""
    lines: queue.Queue[dict[str, Any]] = queue.Queue()

    def read() -> None:
        assert door.stdout is not None
        for line in door.stdout:
            if line.startswith("{"):
                lines.put(json.loads(line))
        lines.put({"ended": True, "waves": -1, "devices": [], "unreachable": None})

    threading.Thread(target=read, daemon=True).start()
    return lines


def next_report(lines: queue.Queue[dict[str, Any]], until: Any, timeout_s: float) -> dict[str, Any]:
    """The first report meeting ``until`` within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        report = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        if until(report):
            return report


def lane_actors() -> dict[str, str]:
    """Alive device actors on the cluster, by name: their actor ids."""
    return {
        actor["Name"]: actor["ActorID"]
        for actor in ray._private.state.actors().values()
        if actor["State"] == "ALIVE" and actor["ActorClassName"] == "LaneActor"
    }


def test_two_front_doors_share_the_device_actors_and_a_killed_one_loses_only_its_own(
    cluster: Cluster,
) -> None:
    head = short(str(cluster.head_node.node_id))
    worker = short(str(next(iter(cluster.worker_nodes)).node_id))
    devices = {f"{OPENVINO}@{head}", f"{ONNXRUNTIME}@{worker}"}
    door = subprocess.Popen(
        [sys.executable, str(HERE / "front_door.py"), cluster.address],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines = reports(door)
        # the other front door serves on both devices
        next_report(lines, lambda r: set(r["devices"]) == devices, 300)
        policy = policy_for(cluster, timeout_s=60, window=40, min_calls=20)
        with Engine(policy, default_registry(), {"encode/full": GRAPHS["encode/full"]}) as engine:
            served = {r.devices["encode"] for r in settle(submit(engine, 8))}
            assert served == devices  # this one too
            before = lane_actors()
            # one actor per device, whichever door asked first: none started twice
            assert set(before) == {actor_name(d) for d in devices}
            waves = next_report(lines, lambda r: True, 30)["waves"]
            next_report(lines, lambda r: r["waves"] > waves, 60)  # it is still serving
            in_flight = submit(engine, 40)
            door.send_signal(signal.SIGKILL)  # mid-load: its own requests die with it
            door.wait(timeout=30)
            later = submit(engine, 40)
            results = settle(in_flight + later)  # 0 of this door's requests failed
            assert {r.devices["encode"] for r in results} == devices
            assert lane_actors() == before  # the same actors, never restarted
    finally:
        if door.poll() is None:
            door.kill()
            door.wait(timeout=30)
