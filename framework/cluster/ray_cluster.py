"""The Ray execution mode: every node's devices as one backend of the engine.

:func:`connect` joins a Ray cluster (``ray.init(address)``), starts one :class:`NodeAgent`
actor on every alive node, pinned there by node affinity (``soft=False``: it never runs
elsewhere), and asks each for its devices. A node that advertises custom resources named
``hetero/<device>`` (``ray start --resources``) lends hetero those devices only, and each lane
reserves a share of its device's resource; a node without any lends every device it has,
unreserved. The devices come back renamed ``<backend>:<id>@<node>`` with ``host`` set to the
node, so the topology model puts the network between nodes, and their ``backend`` is ``ray``:
:class:`RayBackend`, whose devices' models live in one actor per device on their node
(:mod:`~hetero.framework.cluster.remote_lanes`): the engine's scheduler, memory manager and
front-door lanes stay as they are, a load or evict is an actor call, and a stage's large outputs
stay in its device's actor until the next stage (or the response) reads them.

A node that dies is a device failure: the call raises, every device of that node is marked
unhealthy (the engine takes them out of placement after the batch), and the engine retries the
batch's tasks on other devices; outputs that were kept on the node are made again. A device's
actor that dies on a node that is still alive takes only that device out: Ray restarts the
actor, which is given back its stages and resident models, and then the device is readmitted.
Every call to a device's actor has a timeout (``cluster.call_timeout_s``, loads
``cluster.load_timeout_s``) that the device's breaker counts.
The engine polls :meth:`RayBackend.poll_membership` every ``cluster.heartbeat_s``: nodes Ray
reports dead leave placement, and agents start on nodes that joined, whose devices the running
engine takes in.

Only this module imports ``ray`` (the ``hetero[ray]`` extra); the embedded engine never does.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from hetero.framework.backend import Backend, Executable, LoadedModel
from hetero.framework.cluster.agent import NodeAgent
from hetero.framework.cluster.device_groups import merge_telemetry, shape_node
from hetero.framework.cluster.joining import Joining
from hetero.framework.cluster.lane_start import device_resource
from hetero.framework.cluster.remote_lanes import RayModelHost
from hetero.framework.cluster.signals import keeping_sigterm
from hetero.framework.devices import DeviceSpec, Telemetry
from hetero.framework.errors import (
    BackendUnavailableError,
    UnsupportedCapabilityError,
)
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.policy.schema import ClusterConfig

__all__ = ["RAY_BACKEND", "RayBackend", "RayCluster", "connect"]

logger = logging.getLogger(__name__)

RAY_BACKEND = "ray"
TELEMETRY_WAIT_S = 5.0  # how long reading a node's device telemetry may take
DISCOVERY_WAIT_S = 60.0  # how long connecting waits for the nodes' agents to report devices
AGENT_CONCURRENCY = 16  # lanes of one node's devices run side by side, as threads do locally
# the head (Ray's GCS) unanswered for this many heartbeats, at least HEAD_SILENT_MIN_S: the
# front door is not ready (its /ready answers 503)
HEAD_SILENT_BEATS = 3
HEAD_SILENT_MIN_S = 5.0


def _ray() -> Any:
    try:
        import ray  # the hetero[ray] extra: imported only when a policy asks for the cluster
    except ImportError as err:
        raise BackendUnavailableError(
            RAY_BACKEND, f"the policy asks for a Ray cluster: pip install 'hetero[ray]' ({err})"
        ) from err
    except KeyError as err:
        # amdsmi's import raises KeyError where ROCm is missing; Ray 2.60 expects ImportError.
        raise BackendUnavailableError(
            RAY_BACKEND,
            f"ray failed to import ({err!r}): the amdsmi package is installed without ROCm"
            " (the rocm extra); install Ray in a venv without it, or install ROCm",
        ) from err
    return ray


class RayBackend(Backend):
    """The devices of every node, reached through that node's agent."""

    name = RAY_BACKEND
    supports_model_hosts = True
    supports_membership = True

    def __init__(self, cluster: RayCluster | None = None) -> None:
        super().__init__()
        self._cluster = cluster
        self._known: dict[str, DeviceSpec] = {}
        self._formats: dict[str, frozenset[GraphFormat]] = {}
        self._agent_of: dict[str, Any] = {}  # device id -> the node's agent actor
        self._node_of: dict[str, str] = {}
        self._hosts: weakref.WeakSet[RayModelHost] = weakref.WeakSet()  # the heartbeat flushes
        self.door = uuid.uuid4().hex  # this front door, as the shared device actors count it
        self._joining = Joining(lambda device: RayModelHost(self, device))
        self._head_seen = time.monotonic()  # when the head last answered the heartbeat
        self._head_error: str | None = None

    def add(self, node_id: str, agent: Any, devices: list[tuple[DeviceSpec, Any]]) -> None:
        """Take in the devices one node's agent reported."""
        with self._lock:
            for spec, formats in devices:
                self._known[spec.id] = spec
                self._formats[spec.id] = frozenset(formats)
                self._agent_of[spec.id] = agent
                self._node_of[spec.id] = node_id
            self._devices = tuple(self._known.values())

    def node_of(self, device_id: str) -> str:
        """The Ray node id a device lives on."""
        return self._node_of[device_id]

    @property
    def config(self) -> ClusterConfig | None:
        """The policy's ``cluster`` section (None for a backend without a cluster)."""
        return self._cluster.config if self._cluster is not None else None

    def node_alive(self, node_id: str) -> bool:
        """Whether Ray counts ``node_id`` alive now (one read of the GCS; a node whose raylet
        died counts alive until Ray's health check misses it)."""
        try:
            nodes = _ray().nodes()
        except Exception as err:  # the GCS does not answer: nothing is known to be alive
            logger.warning("ray.nodes() failed: %s", err)
            return False
        return any(node["NodeID"] == node_id and node["Alive"] for node in nodes)

    def node_lost(self, node_id: str, reason: str) -> None:
        """Every device of ``node_id`` leaves placement: the node or its agent died."""
        for device_id, node in list(self._node_of.items()):
            if node == node_id:
                self.mark_unhealthy(device_id, reason)

    def accepts(self, graph_format: GraphFormat, device_id: str) -> bool:
        """What the device's own backend takes on its node."""
        return graph_format in self._formats.get(device_id, frozenset())

    def _discover(self) -> list[DeviceSpec]:
        return list(self._known.values())

    def _telemetry(self, device_id: str) -> Telemetry:
        """Read on the device's node by its agent (one call, at most
        :data:`TELEMETRY_WAIT_S`); a node that does not answer marks the device unhealthy."""
        with self._lock:
            agent, spec = self._agent_of[device_id], self._known[device_id]
            served = [h.served for h in self._hosts if h.device.id == device_id and h.served]
        # the GPUs its actor serves (Ray's pick), else the device's own, or a group's members
        members = served[0] if served else spec.properties.get("members")
        members = members or (spec.properties["node_device"],)
        calls = [agent.telemetry.remote(str(local)) for local in members]  # a group: each GPU
        return merge_telemetry(device_id, _ray().get(calls, timeout=TELEMETRY_WAIT_S))

    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        return graph  # compiled on the node, at load

    @staticmethod
    def ray() -> Any:
        """The ``ray`` module (the extra)."""
        return _ray()

    def model_host(self, device: DeviceSpec) -> RayModelHost:
        """The actor of ``device`` on its node, holding its lanes (warm already for a device
        that joined while running)."""
        host = self._joining.host(device.id) or RayModelHost(self, device)
        with self._lock:
            self._hosts.add(host)
        return host

    def forget(self, host: RayModelHost) -> None:
        """A closed host: the heartbeat and ``/metrics`` leave it out."""
        with self._lock:
            self._hosts.discard(host)

    def poll_membership(self) -> list[DeviceSpec]:
        """The heartbeat: nodes Ray reports dead leave placement; agents start on nodes that
        joined, whose devices are warmed (:mod:`~hetero.framework.cluster.joining`) and
        returned once warm. Each device's actor hears that this front door is there, and
        releases the kept outputs it dropped since its last run."""
        with self._lock:
            hosts = list(self._hosts)
        for host in hosts:
            host.flush()
        if self._cluster is None:
            return []
        try:
            self._cluster.watch(
                lambda node: self.node_lost(node, f"node {node[:12]} left (heartbeat)")
            )
            joined = self._cluster.refresh()
        except Exception as err:  # the head does not answer: /ready says so
            self._head_error = f"{type(err).__name__}: {err}"
            raise
        self._head_seen, self._head_error = time.monotonic(), None
        self._joining.start(joined, hosts)
        return self._joining.ready()

    def unreachable(self) -> str | None:
        """Why the cluster's head (Ray's GCS) is out of reach, or None: its last heartbeat
        failed, or none has answered for :data:`HEAD_SILENT_BEATS` heartbeats (a call to a
        lost GCS blocks while Ray tries to reconnect)."""
        config = self.config
        if config is None:
            return None
        if self._head_error is not None:
            return f"the Ray cluster's head does not answer: {self._head_error}"
        silent_s = time.monotonic() - self._head_seen
        if silent_s > max(HEAD_SILENT_MIN_S, HEAD_SILENT_BEATS * config.heartbeat_s):
            return f"the Ray cluster's head (GCS) has not answered for {silent_s:.0f} s"
        return None

    def actor_restarts(self) -> dict[str, int]:
        """Per device, how often its actor died and came back warm (for ``/metrics``)."""
        with self._lock:
            hosts = list(self._hosts)
        counts: dict[str, int] = {}
        for host in hosts:
            counts[host.device.id] = counts.get(host.device.id, 0) + host.restarts
        return counts

    def close(self) -> None:
        """End the actors of devices warmed for joining that the engine never took."""
        self._joining.close()
        super().close()

    def _load(self, executable: Executable) -> tuple[Any, int]:
        raise UnsupportedCapabilityError(_NOT_HERE)

    def _unload(self, model: LoadedModel) -> None:
        raise UnsupportedCapabilityError(_NOT_HERE)

    def _native(self, model: LoadedModel) -> Any:
        raise UnsupportedCapabilityError(_NOT_HERE)

    def _run(self, model: LoadedModel, inputs: Any) -> dict[str, Any]:
        raise UnsupportedCapabilityError(_NOT_HERE)


_NOT_HERE = (
    "a Ray node's models are held by its device actors (RayBackend.model_host), not loaded or"
    " run in the front door"
)


class RayCluster:
    """A connection to a Ray cluster, its agents and the backend over them."""

    def __init__(self, config: ClusterConfig) -> None:
        ray = _ray()
        if not ray.is_initialized():
            try:
                with keeping_sigterm():  # Ray's failure handler would abort on SIGTERM
                    ray.init(
                        address=config.address, namespace=config.namespace, log_to_driver=False
                    )
            except (ConnectionError, RuntimeError) as err:
                raise BackendUnavailableError(
                    RAY_BACKEND,
                    f"no Ray cluster at {config.address!r} (start one with `ray start --head`,"
                    f" or set cluster.address): {err}",
                ) from err
        self.config = config
        self.backend = RayBackend(self)
        self._agents: dict[str, Any] = {}
        # nodes whose agent has not reported yet: agent, its devices() call, lent, since when
        self._pending: dict[str, tuple[Any, Any, set[str], float]] = {}
        self._slow: set[str] = set()  # pending nodes already warned about
        self._gpus: dict[str, float] = {}  # GPUs each node gives Ray (ray start --num-gpus)
        self._lock = threading.Lock()
        self.refresh(DISCOVERY_WAIT_S)

    def refresh(self, wait_s: float = 0.0) -> list[DeviceSpec]:
        """Start agents on alive nodes that have none yet; the devices of every node whose
        agent has reported, waiting at most ``wait_s`` for them. The heartbeat waits for none:
        a node whose discovery hangs (a hung GPU) blocks nothing, and joins when it answers."""
        ray = _ray()
        strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
        actor = ray.remote(NodeAgent)
        with self._lock:
            for node in ray.nodes():
                node_id = node["NodeID"]
                if node["Alive"] and node_id not in self._agents and node_id not in self._pending:
                    lent = {
                        name for name in node.get("Resources", {}) if name.startswith("hetero/")
                    }
                    agent = actor.options(
                        num_cpus=0,
                        max_concurrency=AGENT_CONCURRENCY,
                        max_restarts=0,
                        scheduling_strategy=strategy(node_id=node_id, soft=False),
                    ).remote()
                    self._pending[node_id] = (agent, agent.devices.remote(), lent, time.monotonic())
                    self._gpus[node_id] = float(node.get("Resources", {}).get("GPU", 0))
            pending = dict(self._pending)
        if not pending:
            return []
        node_of = {call: node_id for node_id, (_, call, _, _) in pending.items()}
        answered, _ = ray.wait(list(node_of), num_returns=len(node_of), timeout=wait_s)
        added: list[DeviceSpec] = []
        for call in answered:
            node_id = node_of[call]
            agent, _, reserved, _ = pending[node_id]
            with self._lock:
                self._pending.pop(node_id, None)
                self._agents[node_id] = agent  # a node is asked once, whatever it answers
            try:
                devices = ray.get(call)
            except ray.exceptions.RayError as err:  # discovery raised, or the node left
                logger.warning("ray node %s: no devices: %s", node_id[:12], err)
                continue
            gpus = self._gpus.get(node_id, 0.0)
            named = shape_node(  # the policy's device groups; GPUs shared by their views
                [
                    (_on_node(spec, node_id, bool(reserved), gpus), formats)
                    for spec, formats in devices
                    if not reserved or device_resource(spec.id) in reserved
                ],
                self.config.device_groups,
                gpus,
            )
            self.backend.add(node_id, agent, named)
            added.extend(spec for spec, _ in named)
            logger.info("ray node %s: %d devices", node_id[:12], len(named))
        now, done = time.monotonic(), set(answered)
        for node_id, (_, call, _, since) in pending.items():
            if call not in done and now - since > DISCOVERY_WAIT_S and node_id not in self._slow:
                self._slow.add(node_id)
                logger.warning(
                    "ray node %s: its devices are not discovered after %.0f s; it joins "
                    "once they are",
                    node_id[:12],
                    now - since,
                )
        return added

    def agent(self, node_id: str) -> Any:
        """The agent actor of ``node_id``."""
        return self._agents[node_id]

    @property
    def devices(self) -> tuple[DeviceSpec, ...]:
        """Every device of every node that has an agent."""
        return self.backend.devices()

    def watch(self, on_lost: Callable[[str], None]) -> None:
        """Ask ``on_lost(node_id)`` for every node Ray reports dead (polling, for callers that
        want to fail a node before a call to it does)."""
        for node in _ray().nodes():
            if not node["Alive"] and node["NodeID"] in self._agents:
                on_lost(node["NodeID"])


def _on_node(spec: DeviceSpec, node_id: str, reserved: bool, gpus: float = 0.0) -> DeviceSpec:
    """A node's device as the fleet sees it: unique id, the node as its host, backend ``ray``."""
    node = f"node-{node_id[:8]}"
    return dataclasses.replace(
        spec,
        id=f"{spec.id}@{node}",
        backend=RAY_BACKEND,
        host=node,
        links=(),  # links name peers of the same node by their local ids: not reachable here
        properties={
            **spec.properties,
            "node_id": node_id,
            "node_device": spec.id,
            "node_backend": spec.backend,
            "reserved": reserved,  # its lanes hold a share of the node's hetero/<id> resource
            "node_gpus": gpus,  # a GPU device's actor holds one of them (Ray's GPU resource)
        },
    )


_clusters: dict[tuple[str, str], RayCluster] = {}
_clusters_lock = threading.Lock()


def connect(config: ClusterConfig) -> RayCluster:
    """The process's connection to the cluster at ``config.address`` (made once; a later
    policy's other ``cluster`` settings, such as its timeouts, replace the earlier one's for
    the device hosts made from then on)."""
    key = (config.address, config.namespace)
    with _clusters_lock:
        if key not in _clusters:
            _clusters[key] = RayCluster(config)
        else:
            _clusters[key].config = config
        return _clusters[key]


def disconnect() -> None:
    """Forget every connection (the agents end with the driver); for tests and shutdown."""
    with _clusters_lock:
        _clusters.clear()
