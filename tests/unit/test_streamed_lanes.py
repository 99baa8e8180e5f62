"""Streamed generation in a Ray device actor, without Ray: a ``Generation`` crosses as its wire
form (no callback, no event: it pickles), the actor's streamed run yields each piece as the
plugin makes it and the answer last, and a stop call for one item ends that generation on the
node the way a set ``stop`` event ends it in one process."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from hetero.backends.npu import NpuBackend
from hetero.framework.cluster.agent import NodeAgent
from hetero.framework.cluster.lane_actor import LaneActor
from hetero.framework.cluster.streams import WireGeneration, on_wire
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.registry import Detection, Registry
from hetero.framework.stage_plugin import Generation, GraphRunner, StagePlugin


class Streamer(StagePlugin):
    """Streams ``piece0``, ``piece1``, ... up to ``max_tokens``; after the first piece of a
    request it waits for ``gate`` (the test's turn), then stops early if asked to."""

    name: ClassVar[str] = "streamer"

    def __init__(self) -> None:
        self.gate = threading.Event()

    @property
    def formats(self) -> tuple[GraphFormat, ...]:
        return ()

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        return {}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        out = []
        for job in payloads:
            assert isinstance(job, Generation)
            made = []
            for index in range(job.max_tokens):
                if job.stop.is_set():
                    break
                made.append(f"piece{index}")
                job.on_piece(made[-1])
                if index == 0:
                    self.gate.wait(timeout=60)
            out.append({"text": "".join(made), "stopped": job.stop.is_set()})
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.gate = threading.Event()


def lane() -> tuple[LaneActor, Streamer]:
    registry = Registry(use_entry_points=False)
    registry.register_backend("npu", lambda: Detection.found("npu", NpuBackend))
    spec = next(iter(NodeAgent(registry).devices()))[0]
    actor = LaneActor(spec.id, registry=registry)
    plugin = Streamer()
    actor.add_stage("gen", plugin)
    return actor, plugin


def test_a_generation_crosses_without_its_callback_and_event() -> None:
    seen: list[str] = []
    job = Generation([{"role": "user", "content": "hi"}], 8, 0.5, 3, seen.append)
    wire, streams = on_wire([{"other": 1}, job])
    assert streams == {1: job} and wire[0] == {"other": 1}
    crossed = pickle.loads(pickle.dumps(wire[1]))  # a threading.Event would not pickle
    assert isinstance(crossed, WireGeneration)
    stop = threading.Event()
    rebuilt = crossed.rebuild(seen.append, stop)
    assert (rebuilt.messages, rebuilt.max_tokens, rebuilt.temperature, rebuilt.seed) == (
        [{"role": "user", "content": "hi"}],
        8,
        0.5,
        3,
    )
    assert rebuilt.stop is stop


def test_pieces_stream_in_order_then_the_answer() -> None:
    actor, plugin = lane()
    plugin.gate.set()
    wire, _ = on_wire([Generation([{"role": "user", "content": "hi"}], 3)])
    events = list(actor.run_streamed("gen/full", GraphFormat.ONNX, 0, wire, (), "run-1"))
    assert events[:3] == [("piece", 0, "piece0"), ("piece", 0, "piece1"), ("piece", 0, "piece2")]
    kind, (_, _, shapes, batch_id, _) = events[3]
    assert kind == "done" and batch_id is None
    assert shapes == [("inline", {"text": "piece0piece1piece2", "stopped": False})]
    assert actor.stream_stats() == {"started": 1, "stopped": 0, "running": 0}


def test_a_stop_call_ends_that_generation_on_the_node() -> None:
    actor, plugin = lane()
    wire, _ = on_wire([Generation([{"role": "user", "content": "hi"}], 100)])
    events = actor.run_streamed("gen/full", GraphFormat.ONNX, 0, wire, (), "run-2")
    assert next(events) == ("piece", 0, "piece0")
    assert actor.stream_stats()["running"] == 1
    assert actor.stop("run-2", 0)  # what the front door sends when the client left
    assert not actor.stop("run-2", 0)  # once
    plugin.gate.set()
    rest = list(events)
    assert rest[-1][0] == "done"
    shapes = rest[-1][1][2]
    assert shapes == [("inline", {"text": "piece0", "stopped": True})]  # no second piece
    assert actor.stream_stats() == {"started": 1, "stopped": 1, "running": 0}
    assert not actor.stop("run-2", 0)  # the run is over


def test_a_stop_that_arrives_before_its_run_registers_still_stops_it() -> None:
    """The stop call has its own threads, so it can reach the node before the run does (a
    client that left while the run waited): the run starts stopped, not run to its end."""
    actor, plugin = lane()
    plugin.gate.set()
    assert not actor.stop("run-3", 0)  # nothing running yet: kept for the run
    wire, _ = on_wire([Generation([{"role": "user", "content": "hi"}], 100)])
    events = list(actor.run_streamed("gen/full", GraphFormat.ONNX, 0, wire, (), "run-3"))
    shapes = events[-1][1][2]
    assert shapes == [("inline", {"text": "", "stopped": True})]  # not one piece made
    assert actor.stream_stats() == {"started": 1, "stopped": 1, "running": 0}
    # the control: another run, not stopped, streams to its end
    wire, _ = on_wire([Generation([{"role": "user", "content": "hi"}], 2)])
    events = list(actor.run_streamed("gen/full", GraphFormat.ONNX, 0, wire, (), "run-4"))
    assert events[-1][1][2] == [("inline", {"text": "piece0piece1", "stopped": False})]


def test_a_stream_the_front_door_dropped_stops_its_generation() -> None:
    """Closing the streamed run (Ray does when its caller drops it) sets its stops: the
    generation thread on the node ends instead of decoding to max_tokens for nobody."""
    actor, plugin = lane()
    wire, _ = on_wire([Generation([{"role": "user", "content": "hi"}], 100)])
    events = actor.run_streamed("gen/full", GraphFormat.ONNX, 0, wire, (), "run-5")
    assert next(events) == ("piece", 0, "piece0")
    stops = dict(actor._streams["run-5"])
    events.close()
    assert all(stop.is_set() for stop in stops.values())
    plugin.gate.set()  # the plugin, let go, sees its stop at once
    assert actor.stream_stats()["running"] == 0
