"""Device groups: several GPUs of one node served as one fleet device, for a model that spans
them (tensor parallel: vLLM's ``tensor_parallel_size``).

The policy says which devices are grouped and how many to a group::

    cluster:
      engine: ray
      device_groups: {"vllm:cuda": 2}   # every node's vLLM GPUs, two to a device

On every node that gives Ray at least that many GPUs, the devices whose id on the node is the
key plus an index (``vllm:cuda:0``, ``vllm:cuda:1``, ...) are taken in order, ``size`` at a
time, and each set becomes one device, ``vllm:cuda:0+1@node-...``: its memory, FLOP/s and
bandwidth the members' sums, the formats they all take. Its members leave the fleet (a GPU
is in one group or on its own, never both); a remainder short of a group stays on its own. A
stage runs there as on any device; the policy pins it there the usual ways (``devices.allow``,
``server.runtimes``).

The group's actor runs inside a **placement group** of one bundle per member GPU, each the
whole GPU (``{GPU: 1}``: Ray packs fractional GPU requests onto a GPU already partly used, so
two half-GPU bundles could land on one GPU), ``STRICT_PACK`` on the group's node (bundles that
also hold the members' ``hetero/<device>`` shares where the node advertises them; else Ray's
soft node target, checked once placed). A grouped GPU serves the group alone: the node's other
views of it (``cuda:0`` beside ``vllm:cuda:0+1``) leave the fleet. The placement group is named
after the device and detached, like the actor: every front door gets the same one, and the last
to leave removes it. The actor itself asks for no GPU: it learns the GPUs Ray reserved for the
bundles (one probe task per bundle), fails unless they are as many as its members, makes them
the ``CUDA_VISIBLE_DEVICES`` of the processes it starts, and opens the group on the node's
backend under the ids those processes see (``vllm:cuda:0+1``); the vllm backend runs a group's
engine with ``tensor_parallel_size`` = its member count (vLLM's own workers, one per GPU).
While the placement group lives, Ray hands its GPUs to no other job.

A single GPU that several devices of the node view (``cuda:0`` and ``vllm:cuda:0``) gets a
placement group of its own (``hetero-gpu:cuda:0@<node>``): one bundle, the whole GPU and each
view's resource share; each view's actor runs in it asking for its part of the GPU, so every
view gets the same GPU. The last of the views' actors to end removes it (:mod:`.reap`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hetero.framework.backend import Backend
from hetero.framework.cluster.lane_start import GPU_CLASSES, LANE_SHARE, device_resource
from hetero.framework.devices import DeviceSpec, Telemetry
from hetero.framework.graph import GraphFormat

__all__ = [
    "GPU_PREFIX",
    "GROUP_PREFIX",
    "adopt",
    "bundle_gpus",
    "device_placement",
    "group_bundles",
    "group_gpus",
    "merge_telemetry",
    "open_group",
    "open_placement",
    "placement_name",
    "shape_node",
    "share",
    "visible_env",
]

logger = logging.getLogger(__name__)

GROUP_PREFIX = "hetero-group:"  # a device group's placement group: this and the device id
GPU_PREFIX = "hetero-gpu:"  # a GPU's that several devices view: this and ``<gpu>@<node>``
Lent = tuple[DeviceSpec, frozenset[GraphFormat]]


def placement_name(device_id: str) -> str:
    """The cluster-wide name of a device group's placement group."""
    return f"{GROUP_PREFIX}{device_id}"


def _kind(local_id: str) -> tuple[str, int] | None:
    """``("vllm:cuda", 3)`` for ``vllm:cuda:3``; None for an id without a trailing index."""
    stem = local_id.rstrip("0123456789")
    if stem == local_id:
        return None
    return stem.rstrip(":-"), int(local_id[len(stem) :])


def _physical(spec: DeviceSpec) -> str:
    """The GPU a node's device is a view of, by its id on the node."""
    return str(spec.properties.get("serves") or spec.properties["node_device"])


def shape_node(lent: list[Lent], groups: Mapping[str, int], gpus: float) -> list[Lent]:
    """A node's devices as the fleet takes them: the policy's groups formed (members replaced
    by their group) on a node with enough GPUs; the other views of a grouped GPU left out (a
    group holds its GPUs whole); and each GPU that several devices of the node view (``cuda:0``
    and ``vllm:cuda:0``) given to them through one placement group of its own (:func:`share`)."""
    shaped = list(lent)
    for key, size in groups.items():
        shaped = _group(shaped, key.rstrip(":-"), size, gpus)
    grouped = {str(p) for spec, _ in shaped for p in spec.properties.get("physical_members") or ()}
    views: dict[str, list[str]] = {}
    out: list[Lent] = []
    for spec, formats in shaped:
        single = spec.device_class in GPU_CLASSES and not spec.properties.get("device_group")
        if single and _physical(spec) in grouped:
            logger.info("%s: its GPU is in a device group, which holds it whole", spec.id)
            continue
        if single:
            views.setdefault(_physical(spec), []).append(spec.id)
        out.append((spec, formats))
    return [(share(spec, views), formats) for spec, formats in out]


def share(spec: DeviceSpec, views: Mapping[str, Sequence[str]]) -> DeviceSpec:
    """A single GPU device told how many of the node's devices view its GPU
    (``node_gpu_views``); where that is more than one, the placement group they share
    (``gpu_placement``: one bundle holding the whole GPU, so Ray gives every view the same
    one) and the other views' fleet ids (``gpu_peers``: the last of them to end removes it)."""
    if spec.device_class not in GPU_CLASSES or spec.properties.get("device_group"):
        return spec
    physical = _physical(spec)
    viewers = list(views.get(physical, (spec.id,)))
    if len(viewers) < 2 or float(spec.properties.get("node_gpus", 0)) < 1:
        return _with(spec, node_gpu_views=len(viewers))
    return _with(
        spec,
        node_gpu_views=len(viewers),
        gpu_placement=f"{GPU_PREFIX}{physical}@{spec.host}",
        gpu_peers=tuple(v for v in viewers if v != spec.id),
        gpu_viewers=tuple(str(v).rsplit("@", 1)[0] for v in viewers),
    )


def _with(spec: DeviceSpec, **properties: Any) -> DeviceSpec:
    return dataclasses.replace(spec, properties={**spec.properties, **properties})


def _group(lent: list[Lent], key: str, size: int, gpus: float) -> list[Lent]:
    members = sorted(
        (kind[1], spec, formats)
        for spec, formats in lent
        if (kind := _kind(str(spec.properties["node_device"]))) is not None and kind[0] == key
    )
    if len(members) < size:
        return lent
    if gpus < size:
        logger.warning(
            "%s: device group %r of %d needs %d of Ray's GPUs on the node, which gives %g: "
            "not formed",
            members[0][1].host,
            key,
            size,
            size,
            gpus,
        )
        return lent
    sets = [members[at : at + size] for at in range(0, len(members) - size + 1, size)]
    grouped = {id(spec) for chunk in sets for _, spec, _ in chunk}
    kept = [(spec, formats) for spec, formats in lent if id(spec) not in grouped]
    return kept + [_one_group([(spec, f) for _, spec, f in chunk]) for chunk in sets]


def _one_group(chunk: Sequence[Lent]) -> Lent:
    specs = [spec for spec, _ in chunk]
    first = specs[0]
    locals_ = [str(spec.properties["node_device"]) for spec in specs]
    stem = locals_[0].rstrip("0123456789")
    local = stem + "+".join(name[len(stem) :] for name in locals_)
    flops = {
        dtype: sum(spec.peak_flops.get(dtype, 0.0) for spec in specs) for dtype in first.peak_flops
    }
    serves = [spec.properties.get("serves") for spec in specs]
    properties = {
        **first.properties,
        "node_device": local,
        "device_group": len(specs),
        "members": tuple(locals_),
        "physical_members": tuple(_physical(spec) for spec in specs),
    }
    if all(serves):
        served_stem = str(serves[0]).rstrip("0123456789")
        properties["serves"] = served_stem + "+".join(str(s)[len(served_stem) :] for s in serves)
    else:
        properties.pop("serves", None)
    spec = dataclasses.replace(
        first,
        id=f"{local}@{first.host}",
        vendor_name=f"{len(specs)} x {first.vendor_name}",
        memory_bytes=sum(spec.memory_bytes for spec in specs),
        peak_flops=flops,
        memory_bandwidth_bytes_per_s=sum(spec.memory_bandwidth_bytes_per_s for spec in specs),
        properties=properties,
    )
    formats = frozenset.intersection(*(f for _, f in chunk))
    return spec, formats


def group_bundles(device: DeviceSpec) -> list[dict[str, float]]:
    """The bundles of a device's placement group. A device group's: one per member GPU, each
    that whole GPU (Ray packs fractional GPU requests onto a GPU already partly used, so two
    half-GPU bundles could share one GPU) and, where the node advertises them, a share of the
    member's resource (which pins the bundles to the node). A GPU its views share: one bundle,
    that whole GPU and a share of each view's resource."""
    reserved = bool(device.properties.get("reserved"))
    if device.properties.get("gpu_placement"):  # one GPU, several views
        views = [str(v) for v in device.properties.get("gpu_viewers") or ()]
        return [_whole_gpu(views if reserved else [])]
    members = [str(m) for m in device.properties["members"]]
    return [_whole_gpu([member] if reserved else []) for member in members]


def _whole_gpu(holding: Sequence[str]) -> dict[str, float]:
    return {"GPU": 1.0, **{device_resource(name): LANE_SHARE for name in holding}}


def device_placement(device: DeviceSpec) -> str | None:
    """The name of the placement group ``device``'s actor runs in: its GPU's where several
    devices view it, its own where it is a device group; None where it runs in none."""
    if device.properties.get("gpu_placement"):
        return str(device.properties["gpu_placement"])
    if device.properties.get("device_group"):
        return placement_name(device.id)
    return None


def open_placement(ray: Any, device: DeviceSpec, name: str, wait: Callable[[Any], Any]) -> Any:
    """``device``'s placement group ``name`` (a device group's, or its GPU's where its views
    share it): the one on the cluster (another front door made it, a view of the same GPU, or
    this one before its actor died), else a new one, ready on the device's node (``wait``
    waits for a Ray object ref, or raises). Two front doors that make it at once: the one
    whose creation fails takes the other's."""
    node_id = str(device.properties["node_id"])
    try:
        return ray.util.get_placement_group(name)
    except ValueError:  # none yet
        pass
    try:
        placement = ray.util.placement_group(
            group_bundles(device),
            strategy="STRICT_PACK",
            name=name,
            lifetime="detached",
            _soft_target_node_id=node_id,
        )
    except Exception as err:  # another front door made it meanwhile: that one
        try:
            return ray.util.get_placement_group(name)
        except ValueError:
            raise err from None
    try:
        wait(placement.ready())
        nodes = set(ray.util.placement_group_table(placement)["bundles_to_node_id"].values())
        if nodes != {node_id}:
            raise RuntimeError(f"{device.id}: its placement group went to {nodes}")
    except BaseException:  # not left pending: it would take the GPUs once they are free
        ray.util.remove_placement_group(placement)
        raise
    return placement


def bundle_gpus(ray: Any, placement: Any, count: int) -> list[str]:
    """The GPU ids Ray reserved for the ``count`` bundles of ``placement`` (one probe task
    per bundle, asking for its whole GPU), in bundle order."""
    strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy
    probe = ray.remote(_gpu_ids)
    calls = [
        probe.options(
            num_cpus=0,
            num_gpus=1,
            scheduling_strategy=strategy(placement, placement_group_bundle_index=index),
        ).remote()
        for index in range(count)
    ]
    found: list[str] = []
    for ids in ray.get(calls):
        found.extend(gpu for gpu in ids if gpu not in found)
    return found


def group_gpus(count: int) -> list[str]:
    """The GPUs of the placement group this actor runs in (a device group's of ``count``
    members), bundle by bundle ([] outside Ray)."""
    try:
        import ray
    except ImportError:
        return []
    placement = ray.util.get_current_placement_group() if ray.is_initialized() else None
    return [] if placement is None else bundle_gpus(ray, placement, count)


def _gpu_ids() -> list[str]:
    import ray

    return [str(gpu) for gpu in ray.get_gpu_ids()]


def open_group(local_id: str, members: Sequence[str], gpus: Sequence[str]) -> tuple[str, str]:
    """The id a group's actor opens it by, and the member it is made from: where its members
    are indexed GPU ids (``vllm:cuda:2``) and Ray reserved GPUs for it, the GPUs its processes
    see (``CUDA_VISIBLE_DEVICES`` set to those: ``vllm:cuda:0+1``, from ``vllm:cuda:0``);
    Ray, not hetero, picks which of the node's GPUs the bundles get. Other ids keep theirs."""
    name, _, index = str(members[0]).rpartition(":")
    if not gpus or not name or not index.isdigit():
        return local_id, str(members[0])
    seen = "+".join(str(at) for at in range(len(gpus)))
    return f"{name}:{seen}", f"{name}:0"


def adopt(backend: Backend, member: DeviceSpec, group_id: str, count: int) -> DeviceSpec:
    """The group ``group_id`` opened on a node's ``backend``, made from its first ``member`` as
    that backend found it (``count`` of them: memory, FLOP/s and bandwidth scaled), and added to
    the devices that backend knows in this process, so it compiles, loads and runs there (the
    device actor's own backend instance: no other process sees it)."""
    spec = dataclasses.replace(
        member,
        id=group_id,
        vendor_name=f"{count} x {member.vendor_name}",
        memory_bytes=member.memory_bytes * count,
        peak_flops={dtype: flops * count for dtype, flops in member.peak_flops.items()},
        memory_bandwidth_bytes_per_s=member.memory_bandwidth_bytes_per_s * count,
        properties={**member.properties, "device_group": count},
    )
    backend.add_device(spec)  # the actor's own instance: no other process sees it
    return spec


def visible_env(gpus: Sequence[str]) -> None:
    """The group's GPUs as the processes the actor starts see them (vLLM's workers)."""
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)


def merge_telemetry(device_id: str, reads: Sequence[Telemetry]) -> Telemetry:
    """A device's telemetry from its GPUs' reads (a group's: one each): memory and power
    summed, utilisation their mean."""
    watts = [r.power_watts for r in reads if r.power_watts is not None]
    return Telemetry(
        device_id=device_id,
        memory_used_bytes=sum(r.memory_used_bytes for r in reads),
        utilisation=sum(r.utilisation for r in reads) / len(reads),
        power_watts=sum(watts) if watts else None,
    )
