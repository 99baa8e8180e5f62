"""A Ray device's actor as the front door keeps it: started (or found, when another front
door started it), called with a timeout that turns a dead actor, a dead node or a hung call into
the device's failure, told by the heartbeat that this front door is there, and healed when it
died or Ray restarted it: given back its stages and resident models before the device takes
work again. :class:`~hetero.framework.cluster.remote_lanes.RayModelHost` builds the engine's
model host on it.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from hetero.framework.cluster.device_groups import device_placement, open_placement
from hetero.framework.cluster.lane_actor import LaneActor, StageMissingError
from hetero.framework.cluster.lane_start import (
    READY_WAIT_S,
    DeviceCallTimeoutError,
    actor_name,
    lane_options,
    restarted,
    wait_gone,
)
from hetero.framework.cluster.reap import peers_done
from hetero.framework.cluster.stand_ins import CONTROL_GROUP, CONTROL_THREADS
from hetero.framework.devices import DeviceSpec
from hetero.framework.errors import DeviceUnhealthyError
from hetero.framework.graph import GraphFormat
from hetero.framework.stage_plugin import StagePlugin

if TYPE_CHECKING:
    from hetero.framework.cluster.ray_cluster import RayBackend

__all__ = ["CLOSE_WAIT_S", "ActorLink", "Warmth", "heal_wait_s"]

logger = logging.getLogger(__name__)

CLOSE_WAIT_S = 10.0  # how long closing a device actor waits for its plugins to close
DEFAULT_CALL_TIMEOUT_S = 60.0  # without a cluster config (cluster.call_timeout_s)
DEFAULT_LOAD_TIMEOUT_S = 600.0  # (cluster.load_timeout_s)
DEFAULT_HEARTBEAT_S = 2.0  # (cluster.heartbeat_s)
DOOR_LEASE_BEATS = 5  # a front door not heard from for this many heartbeats counts as gone
DOOR_LEASE_MIN_S = 10.0
HEAL_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # waits between tries to heal; the last repeats
HEAL_FAST_TRIES = 10  # failed tries to heal before the waits between them grow to HEAL_SLOW_S
HEAL_SLOW_S = 600.0  # the wait between tries once HEAL_FAST_TRIES failed (logged once)
# what a device's actor is given to be warm: its stages' plugins, its resident models' loads
Warmth = tuple[dict[str, StagePlugin], dict[str, tuple[GraphFormat, int]]]


def heal_wait_s(tries: int) -> float:
    """The wait before the next try to heal a device after ``tries`` failed ones: growing along
    :data:`HEAL_RETRY_S`, then :data:`HEAL_SLOW_S` once :data:`HEAL_FAST_TRIES` failed (each
    try may wait a load's timeout: a device that does not come back costs little)."""
    if tries + 1 >= HEAL_FAST_TRIES:
        return HEAL_SLOW_S
    return HEAL_RETRY_S[min(tries, len(HEAL_RETRY_S) - 1)]


class ActorLink:
    """One device's actor on its node, from the front door: made on first use, taking in each
    stage when it first loads or runs there, and healed when it dies."""

    def __init__(self, backend: RayBackend, device: DeviceSpec) -> None:
        self.device = device
        self._backend = backend
        self._node_id = str(device.properties["node_id"])
        self._local_id = str(device.properties["node_device"])
        self._handle: Any = None
        self._name = actor_name(device.id)
        self._stages: set[str] = set()
        self._resident: set[str] = set()
        self._lock = threading.Lock()
        self._starting = threading.Lock()
        self._released: collections.deque[str] = collections.deque()  # sent with the next call
        # what a restarted actor is given back before the device takes work again
        self._plugins: dict[str, StagePlugin] = {}
        self._loads: dict[str, tuple[GraphFormat, int]] = {}
        self._healing = False
        self._closed = threading.Event()  # set when the host closes: a heal stops trying
        self._incarnation = ""  # the actor process's, as its last touch answered
        self._touched: Any = None  # the heartbeat's last touch, read at the next
        self.restarts = 0  # times this device's actor died and came back warm
        # the node's ids of the GPUs its actor serves, where Ray gave it others than the
        # device is named after (or a group's): its telemetry is read from those
        self.served: tuple[str, ...] | None = None
        config = backend.config
        self._call_timeout_s = config.call_timeout_s if config else DEFAULT_CALL_TIMEOUT_S
        self._load_timeout_s = config.load_timeout_s if config else DEFAULT_LOAD_TIMEOUT_S
        self._namespace = config.namespace if config else "hetero"
        heartbeat_s = config.heartbeat_s if config else DEFAULT_HEARTBEAT_S
        self._lease_s = max(DOOR_LEASE_MIN_S, DOOR_LEASE_BEATS * heartbeat_s)

    @property
    def actor(self) -> Any:
        """The device's actor (None until a stage first loads or runs here)."""
        with self._lock:
            return self._handle

    @property
    def stages(self) -> set[str]:
        """The stages taken in by the actor so far."""
        with self._lock:
            return set(self._stages)

    def _actor(self, plugin: StagePlugin, stage: str) -> Any:
        with self._lock:
            if stage in self._stages:
                return self._handle
        with self._starting:  # one actor per device, each stage taken in once
            with self._lock:
                actor = self._handle
            if actor is None:
                actor = self._start()
                with self._lock:
                    self._handle = actor
            if stage not in self.stages:
                self._take_in(actor, plugin, stage)
                with self._lock:
                    self._stages.add(stage)
                    self._plugins[stage] = plugin
            return actor

    def _start(self) -> Any:
        """The device's actor: the one on the cluster if another front door started it (or a
        restart left it), else a new one; this front door is counted in."""
        ray = self._backend.ray()
        strategies = ray.util.scheduling_strategies
        members = tuple(str(m) for m in self.device.properties.get("members") or ())
        peers = tuple(str(p) for p in self.device.properties.get("gpu_peers") or ())
        placement = device_placement(self.device)
        if placement:  # a device group, or a GPU its views share: in that placement group
            strategy = strategies.PlacementGroupSchedulingStrategy(
                self._placement(placement),
                placement_group_bundle_index=0,
                placement_group_capture_child_tasks=True,
            )
        else:
            strategy = strategies.NodeAffinitySchedulingStrategy(self._node_id, soft=False)
        options = lane_options(self.device, strategy)
        lanes = ray.remote(concurrency_groups={CONTROL_GROUP: CONTROL_THREADS})(LaneActor)
        actor = lanes.options(**options).remote(
            self._local_id,
            self.device.id,
            lease_s=self._lease_s,
            members=members,
            peers=peers,
            # a call in progress longer than a door waits for one, and a lease, is hung
            call_limit_s=self._call_timeout_s + self._load_timeout_s + self._lease_s,
        )
        try:
            self._call(actor.ready.remote(), "its actor's start", READY_WAIT_S)
        except BaseException:  # it never answered: its placement group is not left behind
            self._give_up(actor, placement)
            raise
        self._incarnation = self._touch(actor)
        if "num_gpus" in options or members:  # Ray picked the GPUs; the actor serves those
            gpus, visible = self._call(actor.gpu_ids.remote(), "its GPUs", READY_WAIT_S)
            name, _, own = (members[0] if members else self._local_id).rpartition(":")
            if gpus and own.isdigit() and (members or own not in gpus):
                # the node's ids of the GPUs it serves: its telemetry is read from those
                self.served = tuple(f"{name}:{gpu}" for gpu in gpus)
                if not members:
                    logger.warning(
                        "%s: Ray gave its actor GPU %s (CUDA_VISIBLE_DEVICES=%s), not %s: it"
                        " serves that one",
                        self.device.id,
                        ",".join(gpus),
                        visible,
                        own,
                    )
        return actor

    def _give_up(self, actor: Any, placement: str | None) -> None:
        """End an actor that never answered, and remove its placement group where no other
        device's actor uses it (a device group's is its own; a shared GPU's, its peers')."""
        ray = self._backend.ray()
        try:
            ray.kill(actor)
        except Exception as err:  # never started
            logger.debug("%s: ending its actor that did not start: %s", self.device.id, err)
        if placement:
            self.release_placement(placement)

    def release_placement(self, name: str) -> None:
        """Remove the placement group ``name`` this device's actor ran in (it is gone), unless
        another device's actor still uses it (a GPU its views share: cluster/reap.py)."""
        ray = self._backend.ray()
        peers = tuple(str(p) for p in self.device.properties.get("gpu_peers") or ())
        if peers and not peers_done(ray, peers, self._namespace):
            return  # the last of them to end removes it
        try:
            ray.util.remove_placement_group(ray.util.get_placement_group(name))
        except Exception as err:  # gone already (its lease ended it), or its node is
            logger.debug("%s: removing its placement group: %s", self.device.id, err)

    def _placement(self, name: str) -> Any:
        """The device's placement group ``name`` (:func:`~.device_groups.open_placement`)."""
        return open_placement(
            self._backend.ray(),
            self.device,
            name,
            lambda ref: self._call(ref, "its placement group", READY_WAIT_S),
        )

    def _touch(self, actor: Any) -> str:
        return str(self._call(actor.touch.remote(self._backend.door), "a touch", READY_WAIT_S))

    def warmth(self) -> Warmth:
        """What this device's actor holds: its stages' plugins and its resident models."""
        with self._lock:
            loads = {key: self._loads[key] for key in self._resident if key in self._loads}
            return dict(self._plugins), loads

    def _take_in(self, actor: Any, plugin: StagePlugin, stage: str) -> None:
        ray = self._backend.ray()
        try:
            self._call(
                actor.add_stage.remote(stage, plugin), "a stage's setup", self._load_timeout_s
            )
        except ray.exceptions.RayTaskError as err:  # the stage could not start on the node
            raise RuntimeError(f"{self.device.id}: stage {stage!r} did not start: {err}") from err

    def _call(self, ref: Any, what: str, timeout_s: float) -> Any:
        """``ray.get`` within ``timeout_s`` (else DeviceCallTimeoutError, which the device's
        breaker counts). An actor that died on a node that is still alive takes this device
        out until it is restarted and warmed again (:meth:`_heal`); a dead node fails every
        device of that node."""
        ray = self._backend.ray()
        try:
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            raise DeviceCallTimeoutError(self.device.id, what, timeout_s) from err
        except ray.exceptions.RayActorError as err:
            if err.actor_init_failed:  # the actor could not start on the node: not the node
                raise RuntimeError(f"{self.device.id}: the lane did not start: {err}") from err
            if self._backend.node_alive(self._node_id):
                reason = f"its actor died ({type(err).__name__}); restarting it"
                self._actor_lost(reason)
                raise DeviceUnhealthyError(self.device.id, reason) from err
            reason = f"node {self._node_id[:12]} left the cluster ({type(err).__name__})"
            self._backend.node_lost(self._node_id, reason)
            raise DeviceUnhealthyError(self.device.id, reason) from err
        except ray.exceptions.RayTaskError as err:
            if not isinstance(getattr(err, "cause", None), StageMissingError):
                raise
            # Ray restarted the actor and it ran a call before it was given its stages back
            reason = "its actor restarted without its stages; warming it"
            self._actor_lost(reason)
            raise DeviceUnhealthyError(self.device.id, reason) from err
        except ray.exceptions.NodeDiedError as err:
            reason = f"node {self._node_id[:12]} left the cluster ({type(err).__name__})"
            self._backend.node_lost(self._node_id, reason)
            raise DeviceUnhealthyError(self.device.id, reason) from err

    def _drain(self) -> list[str]:
        """Kept batches the front door dropped since the last call (deque pops are atomic)."""
        out = []
        while self._released:
            try:
                out.append(self._released.popleft())
            except IndexError:
                break
        return out

    def flush(self) -> None:
        """The heartbeat's call: this front door is still there (its lease on the shared
        actor), and the kept batches it dropped are released now, without waiting for the
        device's next run. The previous beat's answer says whether the actor died or was
        restarted since (a new incarnation): then the device is healed at once, not when a
        run next fails there."""
        actor = self.actor
        if actor is None or self._backend.health(self.device.id) is not None:
            return
        ray = self._backend.ray()
        last, self._touched = self._touched, None
        if last is not None and ray.wait([last], timeout=0)[0]:
            try:
                seen = self._call(last, "a touch", 0.0)
            except Exception as err:  # _call took the device out if the actor died
                logger.debug("%s: its heartbeat: %s", self.device.id, err)
                return
            if seen != self._incarnation:
                self._actor_lost("its actor restarted (heartbeat); warming it")
                return
        touch = actor.touch.options(concurrency_group=CONTROL_GROUP)
        self._touched = touch.remote(self._backend.door, *self._drain())

    def _actor_lost(self, reason: str) -> None:
        """The device's actor died on a node that is alive: the device leaves placement, and
        one thread brings the actor back (:meth:`_heal`)."""
        self._backend.mark_unhealthy(self.device.id, reason)
        with self._lock:
            if self._healing or self._handle is None:
                return
            self._healing = True
        name = f"hetero-heal:{self.device.id}"
        threading.Thread(target=self._heal, name=name, daemon=True).start()

    def _heal(self) -> None:
        """Bring the device back warm (:meth:`_heal_once`), trying again after
        :func:`heal_wait_s` (each wait longer, then every :data:`HEAL_SLOW_S`) while it fails,
        until it comes back, the device is closed, or its node is gone (the heartbeat then names the
        node "left"); only then is the device readmitted."""
        began, tries, before = time.monotonic(), 0, self._incarnation
        try:
            while True:
                try:
                    healed = self._heal_once(before)
                except Exception as err:
                    wait_s = heal_wait_s(tries)
                    tries += 1
                    if not self._backend.node_alive(self._node_id):
                        logger.warning(
                            "%s: its actor did not come back (%s) and its node is gone; it"
                            " stays out",
                            self.device.id,
                            err,
                        )
                        return
                    if tries <= HEAL_FAST_TRIES:
                        logger.warning(
                            "%s: its actor did not come back (%s); it stays out, tried again"
                            " in %g s (try %d)%s",
                            self.device.id,
                            err,
                            wait_s,
                            tries,
                            f"; from now on every {HEAL_SLOW_S:g} s, unlogged"
                            if tries == HEAL_FAST_TRIES
                            else "",
                        )
                    if self._closed.wait(wait_s):  # closed meanwhile: nothing to heal
                        return
                    continue
                if healed is None:  # closed meanwhile
                    return
                break
        finally:
            with self._lock:
                self._healing = False
        plugins, loads = healed
        self._backend.mark_healthy(self.device.id)
        logger.warning(
            "%s: its actor is back, %d stages and %d models in %.1f s (%d failed tries);"
            " readmitted",
            self.device.id,
            plugins,
            loads,
            time.monotonic() - began,
            tries,
        )

    def _heal_once(self, before: str) -> tuple[int, int] | None:
        """One try at bringing the device back: wait for Ray's restart of its actor (or start
        a fresh one once Ray gives up on it), give it back every stage it held and load every
        model that was resident. Its counts of stages and models, or None: closed meanwhile
        (``before``: the actor's incarnation when it was lost)."""
        ray = self._backend.ray()
        actor = self.actor
        if actor is None:  # closed meanwhile
            return None
        if not restarted(ray, actor, self.device.id):  # Ray gave up on it: a fresh actor
            if not self._backend.node_alive(self._node_id):
                raise RuntimeError(f"node {self._node_id[:12]} is gone")
            ray.kill(actor)
            wait_gone(ray, self._name, self._namespace, CLOSE_WAIT_S)
            actor = self._start()  # or the one another front door started meanwhile
        with self._lock:
            if self._handle is None:  # closed meanwhile (and left the actor)
                return None
            self._handle = actor
        self._incarnation, self._touched = self._touch(actor), None
        plugins, loads = self.warmth()
        for stage, plugin in plugins.items():
            ray.get(actor.add_stage.remote(stage, plugin), timeout=self._load_timeout_s)
        for key, (graph_format, threads) in loads.items():
            ray.get(actor.load.remote(key, graph_format, threads), timeout=self._load_timeout_s)
        if self._incarnation != before:  # not a call that failed on a restart healed already
            with self._lock:
                self.restarts += 1
        return len(plugins), len(loads)
