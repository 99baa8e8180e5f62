"""The front door's side of a Ray node's device: a :class:`~hetero.framework.engine.lanes.ModelHost`
whose lanes are actors on that node.

One :class:`~hetero.framework.cluster.lane_actor.LaneActor` per (stage, device), made when the
engine first loads or runs that stage there, pinned to the device's node by node affinity
(``soft=False``) and holding a share of the device's custom resource (``hetero/<device>``) where
the node advertises one, so other Ray work cannot take the whole device. The memory manager's
loads and evictions are calls to it; a batch's outputs stay in that node's object store, and
the engine gets :class:`~hetero.framework.cluster.lane_actor.RayOutput` stand-ins to pass on.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from hetero.framework.cluster.lane_actor import LOST, LaneActor, RayOutput, RayOutputs
from hetero.framework.devices import DeviceSpec
from hetero.framework.engine.lanes import BatchRun
from hetero.framework.errors import (
    DeviceUnhealthyError,
    InputLostError,
    UnsupportedCapabilityError,
)
from hetero.framework.graph import GraphFormat
from hetero.framework.stage_plugin import Generation, StagePlugin

if TYPE_CHECKING:
    from hetero.framework.cluster.ray_cluster import RayBackend

__all__ = ["LANE_SHARE", "RayModelHost", "device_resource"]

logger = logging.getLogger(__name__)

LANE_SHARE = 0.01  # of a device's resource, per lane: up to 100 stages share one device
LANE_CONCURRENCY = 4  # a run, and the memory manager's evictions beside it


def device_resource(local_device_id: str) -> str:
    """The custom Ray resource a node advertises for one of its devices (``ray start
    --resources '{"hetero/npu:openvino/CPU": 1}'``)."""
    return f"hetero/{local_device_id}"


class RayModelHost:
    """The lanes of one device of a Ray node: an actor per stage, made on first use."""

    def __init__(self, backend: RayBackend, device: DeviceSpec) -> None:
        self.device = device
        self._backend = backend
        self._node_id = str(device.properties["node_id"])
        self._local_id = str(device.properties["node_device"])
        self._reserve = bool(device.properties.get("reserved"))
        self._actors: dict[str, Any] = {}
        self._resident: set[str] = set()
        self._lock = threading.Lock()
        self._starting = threading.Lock()

    @property
    def lanes(self) -> dict[str, Any]:
        """The lane actors made so far, by stage."""
        with self._lock:
            return dict(self._actors)

    def _actor(self, plugin: StagePlugin, stage: str) -> Any:
        with self._lock:
            actor = self._actors.get(stage)
        if actor is not None:
            return actor
        with self._starting:  # one actor per stage, however many threads ask at once
            with self._lock:
                actor = self._actors.get(stage)
            if actor is None:
                actor = self._start(plugin, stage)
                with self._lock:
                    self._actors[stage] = actor
            return actor

    def _start(self, plugin: StagePlugin, stage: str) -> Any:
        if isinstance(plugin.probe_payload(), Generation):
            raise UnsupportedCapabilityError(
                f"{self.device.id}: stage {stage!r} streams its generation back piece by piece"
                " through a callback in the front door, which cannot reach a Ray node yet;"
                " serve it on an embedded engine"
            )
        ray = self._backend.ray()
        strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
        options: dict[str, Any] = {
            "num_cpus": 0,
            "max_concurrency": LANE_CONCURRENCY,
            "max_restarts": 0,
            "scheduling_strategy": strategy(node_id=self._node_id, soft=False),
        }
        if self._reserve:
            options["resources"] = {device_resource(self._local_id): LANE_SHARE}
        actor = ray.remote(LaneActor).options(**options).remote(plugin, self._local_id)
        self._call(actor.ready.remote())  # a plugin that cannot start on the node fails here
        return actor

    def _call(self, ref: Any) -> Any:
        """``ray.get``; a dead node or actor fails this device (and its node's others)."""
        ray = self._backend.ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as err:
            if err.actor_init_failed:  # the stage could not start on the node: not the node
                raise RuntimeError(f"{self.device.id}: the lane did not start: {err}") from err
            reason = f"node {self._node_id[:12]} left the cluster ({type(err).__name__})"
            self._backend.node_lost(self._node_id, reason)
            raise DeviceUnhealthyError(self.device.id, reason) from err
        except ray.exceptions.NodeDiedError as err:
            reason = f"node {self._node_id[:12]} left the cluster ({type(err).__name__})"
            self._backend.node_lost(self._node_id, reason)
            raise DeviceUnhealthyError(self.device.id, reason) from err

    def load(
        self, plugin: StagePlugin, model_key: str, graph_format: GraphFormat, threads: int
    ) -> bool:
        """Make ``model_key`` resident on the node's device (an actor call)."""
        actor = self._actor(plugin, model_key.split("/", 1)[0])
        loaded = bool(self._call(actor.load.remote(model_key, graph_format, threads)))
        with self._lock:
            self._resident.add(model_key)
        return loaded

    def run_batch(
        self,
        plugin: StagePlugin,
        model_key: str,
        graph_format: GraphFormat,
        threads: int,
        payloads: list[Any],
    ) -> BatchRun:
        """Run a batch on the node; items whose inputs lay on a node that left get
        :class:`InputLostError` (their producers run again), the rest run."""
        lost = [self._lost_inputs(payload) for payload in payloads]
        live = [payload for payload, gone in zip(payloads, lost, strict=True) if not gone]
        results: list[Any] = [
            InputLostError(gone, "their node left the cluster") for gone in lost if gone
        ]
        if not live:
            return BatchRun(results, 0.0, 0.0)
        actor = self._actor(plugin, model_key.split("/", 1)[0])
        meta_ref, kept_ref = actor.run.options(num_returns=2).remote(
            model_key, graph_format, threads, live
        )
        meta = self._call(meta_ref)
        if meta[0] == LOST:
            sources = tuple(sorted({d for p in live for d in _sources(p)}))
            raise InputLostError(sources, str(meta[1]))
        load_s, run_s, shapes = meta
        with self._lock:
            self._resident.add(model_key)
        made = iter([self._stand_in(kept_ref, index, shape) for index, shape in enumerate(shapes)])
        ordered = [next(made) if not gone else results.pop(0) for gone in lost]
        return BatchRun(ordered, float(load_s), float(run_s))

    def _stand_in(self, ref: Any, index: int, shape: tuple[str, Any]) -> Any:
        kind, detail = shape
        if kind == "error":
            return detail
        if kind == "map":
            parts = {
                key: RayOutput(ref, index, key, self.device.id, nbytes, dims)
                for key, (nbytes, dims) in detail.items()
            }
            return RayOutputs(parts, RayOutput(ref, index, None, self.device.id, 0, ()))
        nbytes, dims = detail
        return RayOutput(ref, index, None, self.device.id, nbytes, dims)

    def _lost_inputs(self, payload: Any) -> tuple[str, ...]:
        return tuple(sorted(d for d in _sources(payload) if self._backend.health(d) is not None))

    def evict(self, model_key: str) -> None:
        """The memory manager's eviction, carried out on the node (nobody waits for it)."""
        with self._lock:
            self._resident.discard(model_key)
            actor = self._actors.get(model_key.split("/", 1)[0])
        if actor is not None and self._backend.health(self.device.id) is None:
            actor.evict.remote(model_key)

    def resident(self, model_key: str) -> bool:
        """Whether ``model_key`` was made resident there (and not evicted since)."""
        with self._lock:
            return model_key in self._resident

    def close(self) -> None:
        """End this device's lane actors (their models go with them)."""
        ray = self._backend.ray()
        with self._lock:
            actors, self._actors = list(self._actors.values()), {}
            self._resident.clear()
        for actor in actors:
            try:
                ray.kill(actor)
            except Exception as err:  # its node is gone already
                logger.debug("%s: ending a lane actor: %s", self.device.id, err)


def _sources(value: Any) -> set[str]:
    """Devices whose outputs ``value`` stands in for."""
    if isinstance(value, RayOutputs):
        return {part.device_id for part in value.values()}
    if isinstance(value, RayOutput):
        return {value.device_id}
    if isinstance(value, dict):
        return set().union(*(_sources(v) for v in value.values())) if value else set()
    if isinstance(value, list | tuple):
        return set().union(*(_sources(v) for v in value)) if value else set()
    return set()
