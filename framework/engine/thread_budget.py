"""How many intra-op threads a batch runs with on a host's cores: the stage's own threads while
the cores have nothing else to do, half of them (at least one) while other work shares them.

A runtime of the host CPU (ONNX Runtime, OpenVINO) splits each operator of a run over its
intra-op threads. Alone on the cores that shortens the run. Beside another batch, or beside the
HTTP work of other requests, the same split makes threads wait for cores and for each other:
on the two-core bench machine (2026-12-06, ninth session) a batch of 8 embedding requests took
11.7 ms of CPU a request with two threads against 10.2 with one, a batch of 4 images 20.4
against 15.4, and the two stages run side by side by two threads each took 14.5-15.0 ms of CPU
an item against 12.6-14.4 with one thread each; yet one request at a time, alone, was 7-14 %
faster with two threads (vision: 13.4 against 17.4 ms). Neither count is right for both.

So a lane runs a batch on the stage's threads while its compute resource is otherwise idle,
and on a copy of its graphs with half the threads while the resource is contended: other
tasks in flight on the same cores (:meth:`CoreSharesMixin.cores_contended`). The copy is loaded
by the first contended batch, so a server that never sees concurrent work never holds it. Only
runtimes whose threads belong to the loaded graph are narrowed (``threads_per_graph`` in the
device's properties): torch's intra-op threads are the process's, so a copy with fewer would
narrow the other copy too. While nothing else is in flight on the cores, the lane runs a batch
in parts side by side instead, a part per thread (:mod:`.lanes`, core slots), each part then
contended by the others. Until the tenth session another live request contended too (the HTTP
work of other requests); with core slots that left a core idle whenever one stage had work and
the other none, and dropping it gave 6-10 % more requests a second at concurrency 8 and 32
(docs/scheduler.md, "Core slots").
"""

from __future__ import annotations

from hetero.framework.devices import DeviceSpec

__all__ = ["narrow_threads", "narrows"]


def narrows(device: DeviceSpec, threads: int) -> bool:
    """Whether a stage with ``threads`` intra-op threads on ``device`` runs on fewer while the
    device's cores are contended: a runtime of the host CPU whose threads are the loaded
    graph's own, with more than one thread to give up."""
    return threads > 1 and device.on_host_cores and bool(device.properties.get("threads_per_graph"))


def narrow_threads(threads: int) -> int:
    """The threads of a contended run: half the stage's (two batches side by side split the
    cores), at least one."""
    return max(1, threads // 2)
