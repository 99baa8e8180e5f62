"""Losing the head of a real two-node Ray cluster on loopback (its own cluster: the test
removes the head): the front door (another process, ``front_door.py``) stops counting itself
ready within seconds (``RayBackend.unreachable``, what ``/ready`` answers 503 with), not after
Ray's own reconnect timeout, and then ends. Run by ``make test-ray``."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from ray.cluster_utils import Cluster

from hetero.framework.cluster.ray_cluster import HEAD_SILENT_MIN_S

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_membership import next_report, reports
from test_ray_cluster import ONNXRUNTIME, OPENVINO, node_args

HERE = pathlib.Path(__file__).parent
# Ray's driver gives the GCS this long to come back, then ends the process
# (gcs_rpc_server_reconnect_timeout_s, 60 s by default)
RAY_RECONNECT_S = 60.0


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """The head (OpenVINO) and one worker (ONNX Runtime); the test removes the head."""
    cluster = Cluster(initialize_head=True, head_node_args=node_args(OPENVINO))
    cluster.add_node(**node_args(ONNXRUNTIME))
    cluster.wait_for_nodes()
    yield cluster
    try:
        cluster.shutdown()
    except Exception as err:  # the head is gone already
        print(f"cluster shutdown: {err}")


def test_a_front_door_whose_cluster_lost_its_head_is_not_ready_and_ends(
    cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    log = tmp_path / "door.log"
    door = subprocess.Popen(
        [sys.executable, str(HERE / "front_door.py"), cluster.address],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    try:
        lines = reports(door)
        # the control: serving, and the head answers
        next_report(lines, lambda r: r["waves"] >= 2 and r["unreachable"] is None, 300)
        cluster.head_node.kill_gcs_server()  # the head's raylet, which this door uses, stays
        lost = time.monotonic()
        report = next_report(lines, lambda r: r["unreachable"] is not None, 60)
        noticed_s = time.monotonic() - lost
        print(f"\nhead lost: not ready after {noticed_s:.1f} s: {report['unreachable']}")
        assert noticed_s < HEAD_SILENT_MIN_S + 10  # not Ray's 60 s
        code = door.wait(timeout=RAY_RECONNECT_S + 60)
        print(f"the front door ended {time.monotonic() - lost:.1f} s after, exit code {code}")
        assert code != 0  # it did not go on as if nothing happened
    finally:
        print(f"the front door's log ends: {log.read_text()[-3000:]}")
        if door.poll() is None:
            door.kill()
            door.wait(timeout=30)
