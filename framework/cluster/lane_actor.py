"""A Ray device's node side: one actor per device that holds the resident models of every stage
placed there and runs the batches the front door's lanes send it.

One process per device, as in the embedded engine (one CUDA context, not one per stage), so a
stage's outputs reach the next stage on the same device without leaving the process: results
too large to go back with the answer are kept here (:class:`~hetero.framework.cluster.kept.
KeptStore`) under a batch id, and the front door gets their sizes and shapes and passes
:class:`~hetero.framework.cluster.stand_ins.RayOutput` stand-ins on. A stand-in for another
device's batch is read from that device's actor (one call, moved by Ray to this node); small
results come back inline with the answer and travel as plain values. The cluster module makes
it an actor; this file imports ``ray`` only to read another actor's outputs, so it runs (and is
tested) without Ray too.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hetero.framework.cluster.device_groups import adopt, group_gpus, open_group, visible_env
from hetero.framework.cluster.kept import ItemShape, KeptStore, describe, pick_from
from hetero.framework.cluster.lane_start import assigned_gpus, visible_device
from hetero.framework.cluster.reap import Lease, start_reaper
from hetero.framework.cluster.stand_ins import CONTROL_GROUP, RayOutput, RayOutputs, collect
from hetero.framework.cluster.streams import PieceQueue
from hetero.framework.engine.device_models import DeviceModels
from hetero.framework.graph import GraphFormat
from hetero.framework.registry import Registry, default_registry
from hetero.framework.stage_plugin import StagePlugin

__all__ = ["LOST", "ItemShape", "LaneActor", "RayOutput", "RayOutputs", "StageMissingError"]

EARLY_STOPS = 1024  # stops kept for runs not registered yet, at most
LOST = "lost"  # a run's answer when its inputs could not be read: their device or node is gone


class StageMissingError(KeyError):
    """A call names a stage this actor was not given: Ray restarted the actor (a fresh
    process, without the stages and models the front door gave the one before)."""


class InputsGoneError(Exception):
    """A kept input could not be read: its batch was dropped, or its actor is gone."""


class LaneActor:
    """The lanes of one device of this node: every stage's models there, and their runs."""

    def __init__(
        self,
        device_id: str,
        fleet_id: str | None = None,
        registry: Registry | None = None,
        lease_s: float = 0.0,
        members: Sequence[str] = (),
        peers: Sequence[str] = (),
        call_limit_s: float = 0.0,
    ) -> None:
        registry = registry or default_registry()
        backend = registry.backend(device_id.split(":", 1)[0])
        self.fleet_id = fleet_id or device_id
        if members:  # a device group: its placement group's GPUs, all of them
            self.gpus = group_gpus(len(members))
            if self.gpus and len(self.gpus) != len(members):  # Ray's GPUs are the group's
                raise RuntimeError(
                    f"{self.fleet_id}: its placement group holds GPUs {self.gpus}, not one"
                    f" for each of its {len(members)} members"
                )
            visible_env(self.gpus)
            opened, template = open_group(device_id, members, self.gpus)
            spec = adopt(backend, backend.device(template), opened, len(members))
        else:
            self.gpus = assigned_gpus()  # Ray's GPU ids for this actor (num_gpus), or none
            spec = backend.device(visible_device(device_id, self.gpus))
        self.models = DeviceModels(backend, spec)
        self.plugins: dict[str, StagePlugin] = {}
        self.kept = KeptStore()
        self._streams: dict[str, dict[int, threading.Event]] = {}  # stops, by run id and item
        self._streams_lock = threading.Lock()
        self._stream_counts = {"started": 0, "stopped": 0}
        # Stops that came before their run was registered here (a client that left while the
        # run waited for a thread or its inputs): applied when it registers; bounded.
        self._early_stops: OrderedDict[tuple[str, int], None] = OrderedDict()
        # the front doors' lease on it; a call older than call_limit_s is hung, not a touch
        self.lease = Lease(lease_s, call_limit_s)
        self.incarnation = uuid.uuid4().hex  # a restarted actor is a new process: a new one
        if lease_s > 0:  # in Ray: it ends itself once no front door touches it (reap.py)
            start_reaper(self.fleet_id, self.lease, self.close, peers)

    def ready(self) -> bool:
        """Answers once the actor is up."""
        return True

    def gpu_ids(self) -> tuple[list[str], str | None]:
        """The GPUs Ray assigned this actor and its ``CUDA_VISIBLE_DEVICES``."""
        return self.gpus, os.environ.get("CUDA_VISIBLE_DEVICES")

    def placement_id(self) -> str | None:
        """The placement group this actor runs in (a device group's), or None."""
        import ray

        placement = ray.util.get_current_placement_group()
        return None if placement is None else str(placement.id.hex())

    def pid(self) -> int:
        """This actor's process id (a restarted actor is a new process)."""
        return os.getpid()

    def resident(self, model_key: str) -> bool:
        """Whether ``model_key`` is resident on the device here."""
        return self.models.resident(model_key)

    def niceness(self) -> int:
        """This process's CPU priority (Ray starts workers at 15 unless told otherwise)."""
        return os.getpriority(os.PRIO_PROCESS, 0)

    def add_stage(self, stage: str, plugin: StagePlugin) -> None:
        """Take in a stage's plugin, set up on this node (idempotent per stage)."""
        with self.lease.present():
            if stage not in self.plugins:
                plugin.prepare()  # idempotent: files another node made are made here too
                plugin.setup()
                self.plugins[stage] = plugin

    def load(self, model_key: str, graph_format: GraphFormat, threads: int) -> bool:
        """Make ``model_key`` resident on the device (True: loaded now)."""
        with self.lease.present():
            return self.models.load(self._plugin(model_key), model_key, graph_format, threads)

    def run(
        self,
        model_key: str,
        graph_format: GraphFormat | str,
        threads: int,
        payloads: list[Any],
        released: Sequence[str] = (),
    ) -> tuple[Any, ...]:
        """Run a batch: ``(load_s, run_s, a shape per item run, batch id or None, lost)``,
        ``lost`` mapping the position of each item whose inputs could not be read to why (the
        others run; shapes and the kept batch cover those alone, in order), or ``(LOST, why)``
        when no item's inputs could be read. Items too large to answer inline are kept here
        under the batch id. ``released``: kept batches the front door let go of."""
        self.release(*released)
        lost: dict[int, str] = {}
        try:
            local = self._resolve(payloads)
        except InputsGoneError as err:
            local, lost = self._resolve_each(payloads)
            if not local:
                return LOST, str(err)
        return self._run(model_key, graph_format, threads, local, lost)

    def run_streamed(
        self,
        model_key: str,
        graph_format: GraphFormat | str,
        threads: int,
        payloads: list[Any],
        released: Sequence[str] = (),
        run_id: str = "",
    ) -> Iterator[tuple[Any, ...]]:
        """:meth:`run` for a batch with streamed generations (a streaming generator method):
        ``("piece", item, text)`` as the pieces are made, then ``("done", run's answer)``;
        :meth:`stop` ends item ``item`` of ``run_id`` early."""
        self.release(*released)
        try:
            local = self._resolve(payloads)
        except InputsGoneError as err:
            yield "done", (LOST, str(err))
            return
        pieces = PieceQueue()
        jobs = pieces.jobs(local)
        with self._streams_lock:
            self._streams[run_id] = pieces.stops
            self._stream_counts["started"] += len(pieces.stops)
            for item, stop in pieces.stops.items():
                if (run_id, item) in self._early_stops:
                    del self._early_stops[(run_id, item)]
                    stop.set()
                    self._stream_counts["stopped"] += 1
        try:
            yield from pieces.follow(lambda: self._run(model_key, graph_format, threads, jobs))
        finally:  # also when the front door dropped the stream: its generations end too
            with self._streams_lock:
                for stop in self._streams.pop(run_id, {}).values():
                    stop.set()

    def stop(self, run_id: str, item: int) -> bool:
        """Stop item ``item``'s generation of the streamed run ``run_id``; True if it was
        running and is stopped now. A run not registered here yet is stopped as it registers
        (a stop for a run that already ended is kept too, and dropped after
        :data:`EARLY_STOPS` later ones)."""
        with self._streams_lock:
            stops = self._streams.get(run_id)
            if stops is None:  # not registered yet: kept for when it is
                self._early_stops[(run_id, item)] = None
                while len(self._early_stops) > EARLY_STOPS:
                    self._early_stops.popitem(last=False)
                return False
            stop = stops.get(item)
            if stop is None or stop.is_set():
                return False
            stop.set()
            self._stream_counts["stopped"] += 1
        return True

    def stream_stats(self) -> dict[str, int]:
        """Streamed generations started here, running now, and stopped by the front door."""
        with self._streams_lock:
            running = sum(len(stops) for stops in self._streams.values())
            return {**self._stream_counts, "running": running}

    def _run(
        self,
        model_key: str,
        graph_format: GraphFormat | str,
        threads: int,
        local: list[Any],
        lost: dict[int, str] | None = None,
    ) -> tuple[Any, ...]:
        plugin = self._plugin(model_key)
        with self.lease.present():
            ran = self.models.run_batch(
                plugin, model_key, GraphFormat(graph_format), threads, local
            )
        shapes = [describe(result) for result in ran.results]
        kept = [
            result if kind in ("map", "value") else None
            for result, (kind, _) in zip(ran.results, shapes, strict=True)
        ]
        batch_id = None
        if any(r is not None for r in kept):
            batch_id = uuid.uuid4().hex
            self.kept.keep(batch_id, kept, sum(_size(shape) for shape in shapes))
        return ran.load_s, ran.run_s, shapes, batch_id, lost or {}

    def pick(self, batch_id: str, picks: Sequence[tuple[int, str | None]]) -> list[Any] | None:
        """Kept outputs for a reader in another process (None: gone)."""
        return self.kept.pick(batch_id, picks)

    def touch(self, door: str, *released: str) -> str:
        """Front door ``door`` is there (its heartbeat, or its first use of this actor); the
        kept batches it let go of since its last call are released. Answers this process's
        incarnation: a front door that sees it change knows Ray restarted the actor (without
        the stages and models it had)."""
        self.lease.touch(door)
        self.release(*released)
        return self.incarnation

    def detach(self, door: str, lease_s: float) -> int:
        """Front door ``door`` leaves: how many others are still there (touched within
        ``lease_s``; a door that died without leaving stops touching). At 0 the leaving door
        closes the actor."""
        return self.lease.detach(door, lease_s)

    def lease_state(self) -> str:
        """This actor's lease as the devices sharing its GPU see it (reap.py): ended, lapsed
        (it ends soon) or live."""
        return self.lease.state(time.monotonic())

    def release(self, *batch_ids: str) -> None:
        """Forget kept batches (the front door dropped their last stand-ins)."""
        for batch_id in batch_ids:
            self.kept.release(batch_id)

    def kept_stats(self) -> dict[str, int]:
        """What is kept here, and how often other processes read it."""
        return self.kept.stats()

    def evict(self, model_key: str) -> None:
        """Release ``model_key`` (the memory manager's decision)."""
        self.models.evict(model_key)

    def close(self) -> None:
        """Release everything this device's lanes hold (for good: :meth:`lease_state`)."""
        try:
            self.models.close()
            self.kept.clear()
            for plugin in self.plugins.values():
                plugin.close()
        finally:
            self.lease.ended = True

    def _plugin(self, model_key: str) -> StagePlugin:
        stage = model_key.split("/", 1)[0]
        try:
            return self.plugins[stage]
        except KeyError:
            raise StageMissingError(f"stage {stage!r} was not taken in here") from None

    def _resolve_each(self, payloads: list[Any]) -> tuple[list[Any], dict[int, str]]:
        """After a batch's inputs could not all be read: each item's on its own, the items
        that can be read (in order) and, by position, why each of the others cannot."""
        local: list[Any] = []
        lost: dict[int, str] = {}
        for position, payload in enumerate(payloads):
            try:
                local.extend(self._resolve([payload]))
            except InputsGoneError as err:
                lost[position] = str(err)
        return local, lost

    def _resolve(self, payloads: list[Any]) -> list[Any]:
        """``payloads`` with every stand-in replaced by its value: this actor's own batches
        read in place, each other actor's batches with one call."""
        outputs: list[RayOutput] = []
        collect(payloads, outputs)
        if not outputs:
            return payloads
        values: dict[tuple[str, int, str | None], Any] = {}
        remote: dict[str, tuple[Any, list[tuple[int, str | None]]]] = {}
        for out in outputs:
            batch = out.batch
            if batch.device_id == self.fleet_id:
                results = self.kept.get(batch.batch_id)
                if results is None:
                    raise InputsGoneError(f"kept outputs of batch {batch.batch_id} were dropped")
                value = pick_from(results, out.index, out.key)
                values[(batch.batch_id, out.index, out.key)] = value
            else:
                remote.setdefault(batch.batch_id, (batch, []))[1].append((out.index, out.key))
        if remote:
            values.update(_read_elsewhere(remote))
        return [_substitute(p, values) for p in payloads]


def _read_elsewhere(
    remote: dict[str, tuple[Any, list[tuple[int, str | None]]]],
) -> dict[tuple[str, int, str | None], Any]:
    """Other actors' kept outputs, one call per batch, all in flight at once."""
    import ray

    try:
        calls = {
            bid: b.handle().pick.options(concurrency_group=CONTROL_GROUP).remote(bid, picks)
            for bid, (b, picks) in remote.items()
        }
        answers = dict(zip(calls, ray.get(list(calls.values())), strict=True))
    except ray.exceptions.RayError as err:  # the producer's actor or node is gone
        raise InputsGoneError(f"{type(err).__name__}: {err}") from err
    except ValueError as err:  # no actor of that name (any more)
        raise InputsGoneError(str(err)) from err
    values = {}
    for bid, found in answers.items():
        if found is None:
            raise InputsGoneError(f"kept outputs of batch {bid} were dropped")
        for (index, key), value in zip(remote[bid][1], found, strict=True):
            values[(bid, index, key)] = value
    return values


def _size(shape: ItemShape) -> int:
    kind, detail = shape
    if kind == "map":
        return sum(nbytes for nbytes, _ in detail.values())
    if kind == "value":
        return int(detail[0])
    return 0


def _substitute(value: Any, values: dict[tuple[str, int, str | None], Any]) -> Any:
    if isinstance(value, RayOutputs):
        return {key: _substitute(part, values) for key, part in value.items()}
    if isinstance(value, RayOutput):
        return values[(value.batch.batch_id, value.index, value.key)]
    if isinstance(value, Mapping):
        return {key: _substitute(item, values) for key, item in value.items()}
    if isinstance(value, list | tuple):
        items = [_substitute(item, values) for item in value]
        if hasattr(value, "_fields"):  # a named tuple takes its fields as arguments
            return type(value)(*items)
        return type(value)(items)
    return value
