"""A front door holding the two fake GPUs of ``test_device_groups.py``'s worker as one device
group, in a process of its own: an engine on the cluster at ``argv[1]`` with that test's
grouped policy (the fake node agent lends the sim backend's two A100s), answering one request
after another until it is killed. After each it prints one JSON line: how many were answered,
by which device, and how long it has been up. Not a test: ``test_device_groups.py`` starts it
and kills it to see its device actor end itself once its lease runs out."""

from __future__ import annotations

import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import numpy as np
import ray
import test_gpu_resources
from test_device_groups import GROUPED
from test_gpu_resources import FakeGpuAgent
from test_self_healing import GRAPHS

from hetero.framework.cluster import ray_cluster
from hetero.framework.engine import Engine
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import default_registry

PAUSE_S = 0.25


def main(address: str) -> None:
    ray_cluster.NodeAgent = FakeGpuAgent  # type: ignore[misc]
    ray.cloudpickle.register_pickle_by_value(test_gpu_resources)
    policy = load_policy_text(GROUPED.format(address=address), "groups.yaml")
    x = np.ones((2, 16), np.float32)
    started, answered = time.monotonic(), 0
    with Engine(policy, default_registry(), {"encode/full": GRAPHS["encode/full"]}) as engine:
        while True:
            result = engine.submit("/one", {"x": x}).result(timeout=120)
            answered += 1
            line = {
                "answered": answered,
                "device": result.devices["encode"],
                "up_s": time.monotonic() - started,
            }
            print(json.dumps(line), flush=True)
            time.sleep(PAUSE_S)  # a request's pace, not synchronisation


if __name__ == "__main__":
    main(sys.argv[1])
