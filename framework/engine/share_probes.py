"""The share of the host's cores a runtime's run takes, as warm-up measures it beside each
timing (:mod:`.probing`); placement weighs runtimes by it while other work runs on the cores
(:mod:`~hetero.framework.scheduler.core_shares`)."""

from __future__ import annotations

import logging
import os
import statistics
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from hetero.framework.devices import DeviceSpec
from hetero.framework.engine.device_models import DeviceModels
from hetero.framework.engine.thread_budget import narrow_threads, narrows

if TYPE_CHECKING:
    from hetero.framework.engine.engine import Engine

__all__ = ["NARROW_RUNS", "narrow_share", "process_share"]

logger = logging.getLogger(__name__)

# Timed runs of each of the runs side by side of a runtime's copy with fewer threads
# (narrow_share), after one untimed: a fresh ONNX Runtime copy of the vision encoder ran its
# first three 15-17 ms, then 12-13.
NARROW_RUNS = 6


def process_share(device: DeviceSpec, cores_busy: list[float]) -> float | None:
    """The share of the host's cores a probe on ``device`` kept busy (the median of its runs'
    process CPU time over wall time, over the cores this process may use); None for a device
    that does not compute on the host's cores, or whose runs kept less than half a core of
    this process busy: its work ran in another process (a worker, a remote node), where this
    process's CPU time does not see it. Warm-up runs one probe at a time, so the process's CPU
    time is the probe's own."""
    if not device.on_host_cores or not cores_busy:
        return None
    busy = statistics.median(cores_busy)
    if busy < 0.5:
        return None
    return min(1.0, busy / (len(os.sched_getaffinity(0)) or 1))


def narrow_share(
    engine: Engine, stage: str, device_id: str, probe: Any, alone_s: float
) -> float | None:
    """For a runtime whose contended batches run on a copy with fewer threads
    (:mod:`.thread_budget`): the share of the host's cores such a run takes for each second
    the stage's own threads take alone (the copy's threads times the median time of a run
    while the copy's runs fill the cores, over ``alone_s`` times the cores). While other work
    runs on the cores, a batch of this runtime runs on that copy beside other runs, and the
    core time it takes there is what placement weighs; a run of the copy alone, with the rest
    of the cores idle, is not that (OpenVINO's vision encoder ran a one-thread run alone as
    fast as ONNX Runtime's and served 11 % fewer images a second with two runs side by side),
    and process CPU time over a run alone (:func:`process_share`) also counts threads waiting
    for each other. The copy is given back (the first contended batch loads it again). None
    where no such copy runs (another runtime, another host, one thread) or it failed."""
    device = engine._device_by_id[device_id]
    threads = engine._threads.get(stage, 0)
    host = engine.models[device_id]
    graph_format = engine.format_for(stage, device_id)
    if alone_s <= 0 or graph_format is None or not isinstance(host, DeviceModels):
        return None
    if not narrows(device, threads):
        return None
    narrow, key, plugin = narrow_threads(threads), f"{stage}/full", engine.plugins[stage]
    cores = len(os.sched_getaffinity(0)) or 1
    side_by_side = max(1, cores // narrow)

    def runs() -> list[float]:
        host.run_batch(plugin, key, graph_format, narrow, [probe])  # lazy set-up, warm caches
        return [
            host.run_batch(plugin, key, graph_format, narrow, [probe]).run_s
            for _ in range(NARROW_RUNS)
        ]

    try:
        host.run_batch(plugin, key, graph_format, narrow, [probe])  # loads it once
        with ThreadPoolExecutor(side_by_side, thread_name_prefix="hetero-share") as pool:
            timed = [
                t for f in [pool.submit(runs) for _ in range(side_by_side)] for t in f.result()
            ]
    except Exception as err:
        logger.warning(
            "stage %s: timing %s on %d thread(s) failed: %s", stage, device_id, narrow, err
        )
        return None
    finally:
        host.release_copy(key, narrow)
    return min(1.0, narrow * statistics.median(timed) / (alone_s * cores))
