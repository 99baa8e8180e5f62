"""A second front door for the Ray tests, in a process of its own: an engine on the cluster at
``argv[1]`` with the self-healing tests' policy (``/one``: the ``encode`` graph on the head's
OpenVINO and the worker's ONNX Runtime devices), serving waves of 4 requests until it is
killed. Every 0.25 s it prints one JSON line: how many waves were answered, the devices that
answered them, and whether its cluster's head answers (``RayBackend.unreachable``). Not a
test: ``test_membership.py`` and ``test_head_loss.py`` start it."""

from __future__ import annotations

import json
import pathlib
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from test_self_healing import GRAPHS, policy_at, settle, submit

from hetero.framework.cluster.ray_cluster import RAY_BACKEND
from hetero.framework.engine import Engine
from hetero.framework.registry import default_registry

REPORT_S = 0.25


def main(address: str) -> None:
    policy = policy_at(address, timeout_s=60, window=40, min_calls=20)
    waves = 0
    devices: set[str] = set()
    with Engine(policy, default_registry(), {"encode/full": GRAPHS["encode/full"]}) as engine:
        backend = engine.backends[RAY_BACKEND]

        def serve() -> None:
            nonlocal waves
            while True:
                for result in settle(submit(engine, 4)):
                    devices.add(result.devices["encode"])
                waves += 1

        threading.Thread(target=serve, daemon=True).start()
        while True:
            line = {
                "waves": waves,
                "devices": sorted(devices),
                "unreachable": backend.unreachable(),  # type: ignore[attr-defined]
            }
            print(json.dumps(line), flush=True)
            time.sleep(REPORT_S)  # a report's period, not synchronisation


if __name__ == "__main__":
    main(sys.argv[1])
