"""The front door's side of a Ray node's device: a :class:`~hetero.framework.engine.lanes.ModelHost`
whose lanes run in one actor on that node.

One :class:`~hetero.framework.cluster.lane_actor.LaneActor` per device, made when the engine
first loads or runs a stage there, pinned to the device's node by node affinity (``soft=False``)
and holding a share of the device's custom resource (``hetero/<device>``) where the node
advertises one, so other Ray work cannot take the whole device; each stage is taken in (its
plugin set up on the node) when it first loads or runs there. The memory manager's loads and
evictions are calls to it; a batch's small results come back with the answer, larger ones stay
in the actor, and the engine gets :class:`~hetero.framework.cluster.stand_ins.RayOutput`
stand-ins to pass on.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from hetero.framework.cluster.lane_actor import LOST, LaneActor, StageMissingError
from hetero.framework.cluster.stand_ins import (
    CONTROL_GROUP,
    CONTROL_THREADS,
    KeptBatch,
    RayOutput,
    RayOutputs,
    sources,
)
from hetero.framework.cluster.streams import on_wire
from hetero.framework.devices import DeviceSpec
from hetero.framework.engine.lanes import BatchRun
from hetero.framework.errors import DeviceError, DeviceUnhealthyError, InputLostError
from hetero.framework.graph import GraphFormat
from hetero.framework.stage_plugin import Generation, StagePlugin

if TYPE_CHECKING:
    from hetero.framework.cluster.ray_cluster import RayBackend

__all__ = [
    "ACTOR_PREFIX",
    "LANE_SHARE",
    "MAX_RESTARTS",
    "DeviceCallTimeoutError",
    "RayModelHost",
    "device_resource",
]

logger = logging.getLogger(__name__)

CLOSE_WAIT_S = 10.0  # how long closing a device actor waits for its plugins to close

LANE_SHARE = 0.01  # of a device's resource, held by its actor while it lives
ACTOR_NICENESS = 0  # a device actor's CPU priority: the front door's lanes', not Ray's 15
ACTOR_PREFIX = "hetero-lanes:"  # a device actor's name: this, the device id, a unique suffix
STOP_POLL_S = 0.05  # how soon a streamed generation's stop reaches its node, at most
LANE_CONCURRENCY = 16  # runs of the device's stages side by side, reads of its kept outputs
MAX_RESTARTS = 3  # times Ray restarts a device's actor that died; then a fresh one is started
READY_WAIT_S = 60.0  # how long a restarted actor may take to answer before it counts as gone
READY_POLL_S = 0.2  # how often a restarting actor is asked whether it is back
DEFAULT_CALL_TIMEOUT_S = 60.0  # without a cluster config (cluster.call_timeout_s)
DEFAULT_LOAD_TIMEOUT_S = 600.0  # (cluster.load_timeout_s)


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


class RayModelHost:
    """The lanes of one device of a Ray node: one actor, made on first use, taking in each
    stage when it first loads or runs there."""

    def __init__(self, backend: RayBackend, device: DeviceSpec) -> None:
        self.device = device
        self._backend = backend
        self._node_id = str(device.properties["node_id"])
        self._local_id = str(device.properties["node_device"])
        self._reserve = bool(device.properties.get("reserved"))
        self._handle: Any = None
        self._name = ""
        self._stages: set[str] = set()
        self._resident: set[str] = set()
        self._lock = threading.Lock()
        self._starting = threading.Lock()
        self._released: collections.deque[str] = collections.deque()  # sent with the next call
        # what a restarted actor is given back before the device takes work again
        self._plugins: dict[str, StagePlugin] = {}
        self._loads: dict[str, tuple[GraphFormat, int]] = {}
        self._healing = False
        self.restarts = 0  # times this device's actor died and came back warm
        config = backend.config
        self._call_timeout_s = config.call_timeout_s if config else DEFAULT_CALL_TIMEOUT_S
        self._load_timeout_s = config.load_timeout_s if config else DEFAULT_LOAD_TIMEOUT_S

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
        ray = self._backend.ray()
        strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
        options: dict[str, Any] = {
            "num_cpus": 0,
            "max_concurrency": LANE_CONCURRENCY,
            # an actor that dies on a live node is restarted by Ray (same name and handle) and
            # warmed by _heal before the device takes work again; calls in flight fail
            "max_restarts": MAX_RESTARTS,
            "scheduling_strategy": strategy(node_id=self._node_id, soft=False),
            # Ray starts workers at nice 15 (below its raylet); a device actor does what a lane
            # thread does in one process, at the same priority, or a loaded node starves it
            "runtime_env": {"env_vars": {"RAY_worker_niceness": str(ACTOR_NICENESS)}},
            # named, so an operator (or a test) can find a device's actor on the cluster
            "name": f"{ACTOR_PREFIX}{self.device.id}:{uuid.uuid4().hex[:12]}",
        }
        self._name = str(options["name"])
        if self._reserve:
            options["resources"] = {device_resource(self._local_id): LANE_SHARE}
        lanes = ray.remote(concurrency_groups={CONTROL_GROUP: CONTROL_THREADS})(LaneActor)
        actor = lanes.options(**options).remote(self._local_id, self.device.id)
        self._call(actor.ready.remote(), "its actor's start", READY_WAIT_S)
        return actor

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
            answer = self._follow(actor, pieces, streams, run_id, timeout_s)
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
        made = iter([_stand_in(batch, index, shape) for index, shape in enumerate(shapes)])
        ran = [  # an item whose kept inputs were gone on the node: its producers run again
            InputLostError(tuple(sorted(sources(live[at]))), unread[at])
            if at in unread
            else next(made)
            for at in range(len(live))
        ]
        ordered = [ran.pop(0) if not gone else results.pop(0) for gone in lost]
        return BatchRun(ordered, float(load_s), float(run_s))

    def _follow(
        self,
        actor: Any,
        pieces: Any,
        streams: dict[int, Generation],
        run_id: str,
        timeout_s: float,
    ) -> Any:
        """A streamed run's answer; on the way each piece goes to its generation's
        ``on_piece``, and a generation whose ``stop`` is set is stopped on the node. No piece
        for ``timeout_s`` fails it (DeviceCallTimeoutError)."""
        ray = self._backend.ray()
        stopping: set[int] = set()

        def stop(item: int) -> None:
            stopping.add(item)
            call = actor.stop.options(concurrency_group=CONTROL_GROUP)
            call.remote(run_id, item)  # not waited for: its pieces end

        last = time.monotonic()
        try:
            while True:
                ready, _ = ray.wait([pieces], timeout=STOP_POLL_S)
                for item, job in streams.items():
                    if item not in stopping and job.stop.is_set():
                        stop(item)
                if not ready:
                    if time.monotonic() - last > timeout_s:
                        raise DeviceCallTimeoutError(
                            self.device.id, "a streamed run's next piece", timeout_s
                        )
                    continue
                last = time.monotonic()
                try:
                    ref = next(pieces)
                except StopIteration:
                    raise RuntimeError(
                        f"{self.device.id}: a streamed run ended unanswered"
                    ) from None
                event = self._call(ref, "a streamed run's piece", self._call_timeout_s)
                if event[0] == "done":
                    return event[1]
                _, item, text = event
                streams[item].on_piece(text)
        except BaseException:  # nobody reads the rest: the node must not decode it for nobody
            for item in streams:
                if item not in stopping:
                    try:
                        stop(item)
                    except Exception:  # the actor is gone: nothing is decoding
                        logger.debug("%s: stop of %s not sent", self.device.id, run_id)
            raise

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
        """Release the dropped kept batches now, without waiting for the next run (the
        heartbeat calls it for an idle device)."""
        released = self._drain()
        actor = self.actor
        if released and actor is not None and self._backend.health(self.device.id) is None:
            actor.release.options(concurrency_group=CONTROL_GROUP).remote(*released)

    def _lost_inputs(self, payload: Any) -> tuple[str, ...]:
        return tuple(sorted(d for d in sources(payload) if self._backend.health(d) is not None))

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
        """Bring the device back warm: wait for Ray's restart of its actor (or start a fresh
        one once Ray gives up on it), give it back every stage it held and load every model
        that was resident, then readmit the device (the engine takes it back into placement
        after its next batch). A device whose actor cannot come back stays out."""
        ray = self._backend.ray()
        began = time.monotonic()
        try:
            actor = self.actor
            if actor is None:  # closed meanwhile
                return
            if not self._restarted(actor):  # Ray gave up on it: a fresh actor
                if not self._backend.node_alive(self._node_id):
                    raise RuntimeError(f"node {self._node_id[:12]} is gone")
                ray.kill(actor)
                actor = self._start()
            with self._lock:
                if self._handle is None:  # closed meanwhile
                    ray.kill(actor)
                    return
                self._handle = actor
                plugins = dict(self._plugins)
                loads = {key: self._loads[key] for key in self._resident if key in self._loads}
            for stage, plugin in plugins.items():
                ray.get(actor.add_stage.remote(stage, plugin), timeout=self._load_timeout_s)
            for key, (graph_format, threads) in loads.items():
                ray.get(actor.load.remote(key, graph_format, threads), timeout=self._load_timeout_s)
        except Exception as err:
            logger.warning(
                "%s: its actor did not come back (%s); it stays out", self.device.id, err
            )
            return
        finally:
            with self._lock:
                self._healing = False
        with self._lock:
            self.restarts += 1
        self._backend.mark_healthy(self.device.id)
        logger.warning(
            "%s: its actor restarted, %d stages and %d models back in %.1f s; readmitted",
            self.device.id,
            len(plugins),
            len(loads),
            time.monotonic() - began,
        )

    def _restarted(self, actor: Any) -> bool:
        """Whether Ray brought ``actor`` back within :data:`READY_WAIT_S` (False: it died for
        good, out of restarts or unschedulable). While Ray restarts it, a call fails at once
        with ActorUnavailableError, and a call that was in flight when it died fails with
        ActorDiedError even though it comes back: asked again every :data:`READY_POLL_S`; two
        ActorDiedErrors in a row mean it is gone."""
        ray = self._backend.ray()
        deadline = time.monotonic() + READY_WAIT_S
        died = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeviceCallTimeoutError(self.device.id, "its restarted actor", READY_WAIT_S)
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
        """End this device's actor: its stage plugins close there first (their models, files
        and helper processes; at most :data:`CLOSE_WAIT_S`), then the actor is killed."""
        ray = self._backend.ray()
        with self._lock:
            actor, self._handle = self._handle, None
            self._stages.clear()
            self._resident.clear()
        if actor is None:
            return
        try:
            ray.get(
                actor.close.options(concurrency_group=CONTROL_GROUP).remote(), timeout=CLOSE_WAIT_S
            )
        except Exception as err:  # its node is gone, or the plugins hang: killed regardless
            logger.debug("%s: closing its actor: %s", self.device.id, err)
        try:
            ray.kill(actor)
        except Exception as err:  # its node is gone already
            logger.debug("%s: ending its actor: %s", self.device.id, err)


def _stand_in(batch: KeptBatch | None, index: int, shape: tuple[str, Any]) -> Any:
    """What the engine holds for one item: its error, its value, or stand-ins for what the
    device's actor kept."""
    kind, detail = shape
    if kind in ("error", "inline"):
        return detail
    assert batch is not None  # a kept item always comes with its batch id
    if kind == "map":
        parts = {
            key: RayOutput(batch, index, key, nbytes, dims)
            for key, (nbytes, dims) in detail.items()
        }
        return RayOutputs(parts, RayOutput(batch, index, None, 0, ()))
    nbytes, dims = detail
    return RayOutput(batch, index, None, nbytes, dims)
