"""The front door's side of a Ray node's device: a
:class:`~hetero.framework.engine.device_models.ModelHost` whose lanes run in one actor on that
node.

One :class:`~hetero.framework.cluster.lane_actor.LaneActor` per device, made when the engine
first loads or runs a stage there, pinned to the device's node by node affinity (``soft=False``)
and holding a share of the device's custom resource (``hetero/<device>``) where the node
advertises one, so other Ray work cannot take the whole device; each stage is taken in (its
plugin set up on the node) when it first loads or runs there. The memory manager's loads and
evictions are calls to it; a batch's small results come back with the answer, larger ones stay
in the actor, and the engine gets :class:`~hetero.framework.cluster.stand_ins.RayOutput`
stand-ins to pass on. Starting, calling and healing the actor is
:class:`~hetero.framework.cluster.actor_link.ActorLink`'s.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from hetero.framework.cluster.actor_link import CLOSE_WAIT_S, ActorLink, Warmth
from hetero.framework.cluster.device_groups import device_placement
from hetero.framework.cluster.lane_actor import LOST
from hetero.framework.cluster.lane_start import (
    ACTOR_NICENESS,
    ACTOR_PREFIX,
    LANE_SHARE,
    MAX_RESTARTS,
    DeviceCallTimeoutError,
    device_resource,
    wait_gone,
)
from hetero.framework.cluster.stand_ins import CONTROL_GROUP, KeptBatch, sources, stand_in
from hetero.framework.cluster.stream_calls import follow
from hetero.framework.cluster.streams import on_wire
from hetero.framework.engine.device_models import BatchRun
from hetero.framework.errors import InputLostError
from hetero.framework.graph import GraphFormat
from hetero.framework.stage_plugin import StagePlugin

__all__ = [
    "ACTOR_NICENESS",
    "ACTOR_PREFIX",
    "LANE_SHARE",
    "MAX_RESTARTS",
    "DeviceCallTimeoutError",
    "RayModelHost",
    "Warmth",
    "device_resource",
]

logger = logging.getLogger(__name__)


class RayModelHost(ActorLink):
    """The lanes of one device of a Ray node: the engine's model host over its actor."""

    def warm(self, warmth: Warmth) -> None:
        """Start the device's actor if need be and give it ``warmth`` (stages set up, models
        loaded), as the device's first runs would, before the engine places anything here (a
        device that joined with its node; :meth:`RayBackend.poll_membership`)."""
        plugins, loads = warmth
        for stage, plugin in plugins.items():
            self._actor(plugin, stage)
        for key, (graph_format, threads) in loads.items():
            self.load(plugins[key.split("/", 1)[0]], key, graph_format, threads)

    def load(
        self, plugin: StagePlugin, model_key: str, graph_format: GraphFormat, threads: int
    ) -> bool:
        """Make ``model_key`` resident on the node's device (an actor call)."""
        actor = self._actor(plugin, model_key.split("/", 1)[0])
        call = actor.load.remote(model_key, graph_format, threads)
        loaded = bool(self._call(call, f"the load of {model_key}", self._load_timeout_s))
        with self._lock:
            self._resident.add(model_key)
            self._loads[model_key] = (graph_format, threads)
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
        released = self._drain()
        wire, streams = on_wire(live)
        # a run that loads first may take a load's time
        resident = self.resident(model_key)
        timeout_s = self._call_timeout_s + (0.0 if resident else self._load_timeout_s)
        if streams:  # pieces come back as they are made; the answer last
            run_id = uuid.uuid4().hex
            pieces = actor.run_streamed.options(num_returns="streaming").remote(
                model_key, graph_format.value, threads, wire, released, run_id
            )
            answer = follow(
                self._backend.ray(),
                actor,
                pieces,
                streams,
                run_id,
                lambda ref: self._call(ref, "a streamed run's piece", self._call_timeout_s),
                lambda: DeviceCallTimeoutError(
                    self.device.id, "a streamed run's next piece", timeout_s
                ),
                timeout_s,
            )
        else:
            # the format by value: an enum costs Ray's serialiser a by-reference pickle
            call = actor.run.remote(model_key, graph_format.value, threads, wire, released)
            answer = self._call(call, f"a run of {model_key}", timeout_s)
        if answer[0] == LOST:
            found = tuple(sorted({d for p in live for d in sources(p)}))
            raise InputLostError(found, str(answer[1]))
        load_s, run_s, shapes, batch_id, unread = answer
        with self._lock:
            self._resident.add(model_key)
            self._loads[model_key] = (graph_format, threads)
        batch = None
        if batch_id is not None:
            batch = KeptBatch(actor, batch_id, self.device.id, self._released.append, self._name)
        made = iter([stand_in(batch, index, shape) for index, shape in enumerate(shapes)])
        ran = [  # an item whose kept inputs were gone on the node: its producers run again
            InputLostError(tuple(sorted(sources(live[at]))), unread[at])
            if at in unread
            else next(made)
            for at in range(len(live))
        ]
        ordered = [ran.pop(0) if not gone else results.pop(0) for gone in lost]
        return BatchRun(ordered, float(load_s), float(run_s))

    def _lost_inputs(self, payload: Any) -> tuple[str, ...]:
        return tuple(sorted(d for d in sources(payload) if self._backend.health(d) is not None))

    def evict(self, model_key: str) -> None:
        """The memory manager's eviction, carried out on the node (nobody waits for it)."""
        with self._lock:
            self._resident.discard(model_key)
            actor = self._handle
        if actor is not None and self._backend.health(self.device.id) is None:
            actor.evict.remote(model_key)

    def resident(self, model_key: str) -> bool:
        """Whether ``model_key`` was made resident there (and not evicted since)."""
        with self._lock:
            return model_key in self._resident

    def close(self) -> None:
        """Leave this device's actor: the last front door to leave ends it (its stage plugins
        close there first: their models, files and helper processes; at most
        :data:`CLOSE_WAIT_S`; then the actor is killed); while another front door uses it,
        it goes on serving that one."""
        ray = self._backend.ray()
        self._backend.forget(self)
        self._closed.set()
        with self._lock:
            actor, self._handle = self._handle, None
            self._stages.clear()
            self._resident.clear()
        if actor is None:
            return
        control = {"concurrency_group": CONTROL_GROUP}
        try:
            others = ray.get(
                actor.detach.options(**control).remote(self._backend.door, self._lease_s),
                timeout=CLOSE_WAIT_S,
            )
        except ray.exceptions.GetTimeoutError as err:
            # it did not answer in time: other front doors may still use it, so it is not
            # killed; its lease ends it once none touches it (cluster/reap.py)
            logger.warning(
                "%s: its actor did not answer the leave (%s); left to its lease",
                self.device.id,
                err,
            )
            return
        except Exception as err:  # dead (no reaper runs in it), or its node is gone
            logger.debug("%s: leaving its actor, which is gone: %s", self.device.id, err)
            others = 0
        if others:
            logger.info("%s: its actor stays for %d other front doors", self.device.id, others)
            return
        try:
            ray.get(actor.close.options(**control).remote(), timeout=CLOSE_WAIT_S)
        except Exception as err:  # its node is gone, or the plugins hang: killed regardless
            logger.debug("%s: closing its actor: %s", self.device.id, err)
        try:
            ray.kill(actor)
        except Exception as err:  # its node is gone already
            logger.debug("%s: ending its actor: %s", self.device.id, err)
        # its name is free again before a front door started next asks for it
        wait_gone(ray, self._name, self._namespace, CLOSE_WAIT_S)
        placement = device_placement(self.device)
        if placement:  # its GPUs are free again (a shared GPU's once its views are done)
            self.release_placement(placement)
