"""Starting a Ray device's actor: one per device on the whole cluster, shared by every front door.

The actor is named after the device (``hetero-lanes:<device id>``, in the policy's Ray
namespace), detached (it outlives the front door that made it) and got-or-created: a second
``hetero serve`` on the same cluster gets the first one's actor instead of starting a second
process on the same device. Each front door says it is there (``touch``, with its heartbeat) and
leaves (``detach``) when it closes; the last one to leave closes the actor, so a front door that
dies takes none of the devices' actors with it: the others' requests go on.

It holds a share of the device's custom resource (``hetero/<device>``) where the node
advertises one, so other Ray work cannot take the whole device while it lives, and, for a GPU
on a node that gives Ray GPUs (``ray start --num-gpus``), one of Ray's GPUs (``num_gpus=1``):
Ray hands that GPU to no other job while hetero holds it. Devices of one node that are views of
one GPU (``cuda:0`` and vLLM's ``vllm:cuda:0``) share it, and not by asking Ray for half a GPU
each on the node: Ray packs a fractional request onto a GPU already partly used, so ``cuda:0``
and ``cuda:1`` could both get GPU 0. The views' actors run in one placement group of their GPU
(one bundle: the whole GPU; :mod:`~hetero.framework.cluster.device_groups`), each asking for
its share within it (``num_gpus=0.5`` for two): the bundle has one GPU, so they get the same.
Ray then sets the actor's ``CUDA_VISIBLE_DEVICES`` to the GPU it assigned, and the actor's
device id follows (:func:`visible_device`). A device group (several GPUs as one device) asks
for no GPU itself: its placement group holds them, and the actor runs inside it.
"""

from __future__ import annotations

import time
from typing import Any

from hetero.framework.devices import DeviceClass, DeviceSpec
from hetero.framework.errors import DeviceError

__all__ = [
    "ACTOR_NICENESS",
    "ACTOR_PREFIX",
    "LANE_CONCURRENCY",
    "LANE_SHARE",
    "MAX_RESTARTS",
    "READY_WAIT_S",
    "DeviceCallTimeoutError",
    "actor_name",
    "assigned_gpus",
    "device_resource",
    "gpu_share",
    "lane_options",
    "restarted",
    "visible_device",
    "wait_gone",
]

LANE_SHARE = 0.01  # of a device's resource, held by its actor while it lives
ACTOR_NICENESS = 0  # a device actor's CPU priority: the front door's lanes', not Ray's 15
ACTOR_PREFIX = "hetero-lanes:"  # a device actor's name: this and the device id
LANE_CONCURRENCY = 16  # runs of the device's stages side by side, reads of its kept outputs
MAX_RESTARTS = 3  # times Ray restarts a device's actor that died; then a fresh one is started
GPU_CLASSES = frozenset({DeviceClass.CUDA, DeviceClass.ROCM})  # what Ray counts as GPUs
GONE_POLL_S = 0.05  # how often a killed actor's name is looked up until it is free
READY_WAIT_S = 60.0  # how long a restarted actor may take to answer before it counts as gone
READY_POLL_S = 0.2  # how often a restarting actor is asked whether it is back


class DeviceCallTimeoutError(DeviceError, TimeoutError):
    """A call to a device's actor took longer than its timeout (the device is blamed: its
    breaker counts the failure and the engine runs the batch elsewhere)."""

    def __init__(self, device_id: str, what: str, timeout_s: float) -> None:
        self.device_id = device_id
        super().__init__(f"{device_id}: {what} did not answer within {timeout_s:g} s")


def device_resource(local_device_id: str) -> str:
    """The custom Ray resource a node advertises for one of its devices (``ray start
    --resources '{"hetero/npu:openvino/CPU": 1}'``)."""
    return f"hetero/{local_device_id}"


def actor_name(device_id: str) -> str:
    """The cluster-wide name of a device's actor (its fleet id names the node too)."""
    return f"{ACTOR_PREFIX}{device_id}"


def gpu_share(device: DeviceSpec) -> float:
    """The part of one of Ray's GPUs ``device``'s actor holds: 1, or 1/k where k devices of the
    node are views of one GPU (``node_gpu_views``, counted when the node joined; asked within
    their GPU's placement group, whose one bundle is that whole GPU); 0 for a device
    that is not a GPU, on a node that gives Ray no GPUs, or a device group (its placement group
    holds its GPUs)."""
    if device.device_class not in GPU_CLASSES or device.properties.get("device_group"):
        return 0.0
    if float(device.properties.get("node_gpus", 0)) < 1:
        return 0.0
    return 1.0 / max(1, int(device.properties.get("node_gpu_views", 1)))


def lane_options(device: DeviceSpec, strategy: Any) -> dict[str, Any]:
    """Ray's options for ``device``'s actor: pinned to its node (``strategy``: node affinity,
    or a device group's placement group), named, detached, got-or-created, restarted by Ray
    when it dies, holding its share of the device's resource and of its GPU (in a placement
    group, the bundle holds the resource)."""
    options: dict[str, Any] = {
        "num_cpus": 0,
        "max_concurrency": LANE_CONCURRENCY,
        # an actor that dies on a live node is restarted by Ray (same name and handle) and
        # warmed before the device takes work again; calls in flight fail
        "max_restarts": MAX_RESTARTS,
        "scheduling_strategy": strategy,
        # Ray starts workers at nice 15 (below its raylet); a device actor does what a lane
        # thread does in one process, at the same priority, or a loaded node starves it
        "runtime_env": {"env_vars": {"RAY_worker_niceness": str(ACTOR_NICENESS)}},
        # one per device on the cluster, whichever front door asks first; it outlives that
        # one (the last front door to leave closes it)
        "name": actor_name(device.id),
        "get_if_exists": True,
        "lifetime": "detached",
    }
    in_placement = device.properties.get("device_group") or device.properties.get("gpu_placement")
    if device.properties.get("reserved") and not in_placement:  # else its bundle holds it
        local = str(device.properties["node_device"])
        options["resources"] = {device_resource(local): LANE_SHARE}
    share = gpu_share(device)
    if share:
        options["num_gpus"] = share  # Ray's own accounting: no other job is handed this GPU
    return options


def assigned_gpus() -> list[str]:
    """Ray's GPU ids for this actor ([] outside Ray, or without ``num_gpus``)."""
    try:
        import ray
    except ImportError:
        return []
    if not ray.is_initialized():
        return []
    return [str(gpu) for gpu in ray.get_gpu_ids()]


def visible_device(local_device_id: str, assigned: list[str]) -> str:
    """The id a device actor opens its device by once Ray assigned it GPUs (``num_gpus``): Ray
    sets ``CUDA_VISIBLE_DEVICES`` (``HIP_VISIBLE_DEVICES``) to the ``assigned`` GPU ids, so the
    GPU the node calls ``cuda:3`` is ``cuda:0`` inside an actor given GPU 3. Ray picks the
    GPU, not hetero: given another than the device's own, the actor serves the one Ray gave
    it (``cuda:0``: its first visible GPU), so Ray's accounting and the GPU in use agree (the
    host warns). Ids without a trailing ``:<index>`` (a fake or simulated device) and actors
    given no GPU keep theirs."""
    name, _, index = local_device_id.rpartition(":")
    if not assigned or not name or not index.isdigit():
        return local_device_id
    return f"{name}:{assigned.index(index) if index in assigned else 0}"


def wait_gone(ray: Any, name: str, namespace: str, timeout_s: float) -> bool:
    """Whether the actor named ``name`` is gone within ``timeout_s`` (Ray frees a killed
    actor's name asynchronously; a front door started next must not get the dying one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            return True
        time.sleep(GONE_POLL_S)  # polling the GCS, not synchronisation between threads
    return False


def restarted(ray: Any, actor: Any, device_id: str) -> bool:
    """Whether Ray brought ``actor`` back within :data:`READY_WAIT_S` (False: it died for
    good, out of restarts or unschedulable). While Ray restarts it, a call fails at once
    with ActorUnavailableError, and a call that was in flight when it died fails with
    ActorDiedError even though it comes back: asked again every :data:`READY_POLL_S`; two
    ActorDiedErrors in a row mean it is gone."""
    deadline = time.monotonic() + READY_WAIT_S
    died = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeviceCallTimeoutError(device_id, "its restarted actor", READY_WAIT_S)
        try:
            ray.get(actor.ready.remote(), timeout=left)
            return True
        except ray.exceptions.ActorUnavailableError:
            died = 0
        except ray.exceptions.RayActorError:
            died += 1
            if died == 2:
                return False
        time.sleep(READY_POLL_S)  # restarting: a retry's pause, not synchronisation
