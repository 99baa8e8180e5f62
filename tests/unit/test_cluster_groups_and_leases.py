"""The Ray mode's device groups, GPU shares, healing retries, leaving and lease reaper, without
Ray (this venv has none): pure functions of ``hetero.framework.cluster.device_groups`` and
``lane_start``, and a device's host over **named fakes** of the ``ray`` module, a device actor
and the cluster backend. ``make test-ray`` runs the real ones (tests/ray/test_device_groups.py:
a placement group over two fake GPUs and the reaper on a real cluster)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hetero.framework.cluster import actor_link, lane_actor, reap
from hetero.framework.cluster.device_groups import (
    device_placement,
    group_bundles,
    open_group,
    shape_node,
)
from hetero.framework.cluster.lane_start import gpu_share, lane_options
from hetero.framework.cluster.remote_lanes import RayModelHost
from hetero.framework.devices import DeviceClass, DeviceSpec
from hetero.framework.graph import GraphFormat

NODE = "node-12345678"
ALL = frozenset(GraphFormat)


def gpu(local: str, serves: str | None = None, memory: int = 2**30) -> DeviceSpec:
    properties: dict[str, Any] = {
        "node_id": "12345678abcdef",
        "node_device": local,
        "reserved": True,
        "node_gpus": 4.0,
    }
    if serves:
        properties["serves"] = serves
    return DeviceSpec(
        id=f"{local}@{NODE}",
        device_class=DeviceClass.CUDA,
        vendor_name="a GPU (fake)",
        backend="ray",
        host=NODE,
        memory_bytes=memory,
        peak_flops={"fp16": 1e12},
        memory_bandwidth_bytes_per_s=1e11,
        properties=properties,
    )


def node() -> list[tuple[DeviceSpec, frozenset[GraphFormat]]]:
    """Four of vLLM's GPU views and two of the cuda backend's (the same GPUs 0 and 1)."""
    vllm = [
        (gpu(f"vllm:cuda:{i}", serves=f"cuda:{i}"), frozenset({GraphFormat.VLLM})) for i in range(3)
    ]
    return [*vllm, (gpu("cuda:0"), ALL), (gpu("cuda:1"), ALL)]


def test_a_group_is_one_device_over_its_members_and_they_leave_the_fleet() -> None:
    shaped = {spec.id: (spec, formats) for spec, formats in shape_node(node(), {"vllm:cuda": 2}, 4)}
    group, formats = shaped[f"vllm:cuda:0+1@{NODE}"]
    assert f"vllm:cuda:0@{NODE}" not in shaped and f"vllm:cuda:1@{NODE}" not in shaped
    assert f"vllm:cuda:2@{NODE}" in shaped  # short of a group: on its own
    assert group.memory_bytes == 2 * 2**30 and group.peak_flops["fp16"] == 2e12
    assert formats == {GraphFormat.VLLM}
    assert group.properties["device_group"] == 2
    assert group.properties["members"] == ("vllm:cuda:0", "vllm:cuda:1")
    assert group.properties["serves"] == "cuda:0+1"
    # the group holds GPUs 0 and 1 whole: the cuda backend's views of them leave the fleet
    # (half-GPU bundles could both land on one GPU: Ray packs fractions onto a used GPU)
    assert f"cuda:0@{NODE}" not in shaped and f"cuda:1@{NODE}" not in shaped
    assert gpu_share(shaped[f"vllm:cuda:2@{NODE}"][0]) == 1.0  # nothing else views GPU 2
    assert group_bundles(group) == [
        {"GPU": 1.0, "hetero/vllm:cuda:0": 0.01},
        {"GPU": 1.0, "hetero/vllm:cuda:1": 0.01},
    ]
    assert device_placement(group) == f"hetero-group:vllm:cuda:0+1@{NODE}"
    # the group's actor asks for no GPU of its own (its placement group holds them)
    options = lane_options(group, strategy=None)
    assert "num_gpus" not in options and "resources" not in options


def test_without_groups_or_gpus_enough_nothing_is_grouped() -> None:
    ids = {spec.id for spec, _ in node()}
    assert {spec.id for spec, _ in shape_node(node(), {}, 4)} == ids  # the control
    assert {spec.id for spec, _ in shape_node(node(), {"vllm:cuda": 2}, 1)} == ids


def test_views_of_one_gpu_share_it_through_a_placement_group_of_that_gpu() -> None:
    shaped = {s.id: s for s, _ in shape_node(node(), {}, 4)}
    cuda0, vllm0 = shaped[f"cuda:0@{NODE}"], shaped[f"vllm:cuda:0@{NODE}"]
    # one placement group for GPU 0, one bundle holding the whole GPU and both views' shares:
    # Ray gives both actors the GPU of that bundle (asked on the node, half a GPU each could
    # land cuda:0 and cuda:1 on the same GPU)
    assert device_placement(cuda0) == device_placement(vllm0) == f"hetero-gpu:cuda:0@{NODE}"
    assert group_bundles(cuda0) == [{"GPU": 1.0, "hetero/vllm:cuda:0": 0.01, "hetero/cuda:0": 0.01}]
    assert group_bundles(vllm0) == group_bundles(cuda0)
    assert cuda0.properties["gpu_peers"] == (vllm0.id,)
    assert vllm0.properties["gpu_peers"] == (cuda0.id,)
    options = lane_options(cuda0, strategy=None)
    assert options["num_gpus"] == 0.5 and "resources" not in options  # its bundle holds it
    # a GPU one device views: no placement group, the whole GPU asked on the node
    vllm2 = shaped[f"vllm:cuda:2@{NODE}"]
    assert device_placement(vllm2) is None and gpu_share(vllm2) == 1.0
    assert lane_options(vllm2, None)["resources"] == {"hetero/vllm:cuda:2": 0.01}


def test_a_group_actor_fails_unless_ray_gave_it_a_gpu_per_member(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lane_actor, "group_gpus", lambda count: ["0"])
    with pytest.raises(RuntimeError, match="not one for each of its 2 members"):
        lane_actor.LaneActor("sim:a100-0+1", members=("sim:a100-0", "sim:a100-1"))
    # the control: a GPU each
    monkeypatch.setattr(lane_actor, "group_gpus", lambda count: ["0", "1"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    actor = lane_actor.LaneActor("sim:a100-0+1", members=("sim:a100-0", "sim:a100-1"))
    assert actor.models.device.properties["device_group"] == 2
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_a_model_over_several_gpus_runs_on_vllms_multiprocessing_executor(
    tmp_path: Path,
) -> None:
    from hetero.framework.executors.vllm_executor import EngineSettings, engine_args

    two = engine_args(EngineSettings(model_dir=tmp_path, tensor_parallel_size=2))
    assert two["distributed_executor_backend"] == "mp" and two["tensor_parallel_size"] == 2
    assert "distributed_executor_backend" not in engine_args(EngineSettings(model_dir=tmp_path))


def test_a_group_opens_as_the_gpus_its_placement_group_holds() -> None:
    assert open_group("vllm:cuda:2+3", ["vllm:cuda:2", "vllm:cuda:3"], ["2", "3"]) == (
        "vllm:cuda:0+1",
        "vllm:cuda:0",
    )
    # ids without a trailing GPU index (the sim stand-ins) keep theirs
    assert open_group("sim:a100-0+1", ["sim:a100-0", "sim:a100-1"], ["0", "1"]) == (
        "sim:a100-0+1",
        "sim:a100-0",
    )


# --- a device's host over fakes -------------------------------------------------------------


class FakeRayErrors:
    """The exception classes the host catches (a fake of ``ray.exceptions``)."""

    class RayError(Exception):
        pass

    class GetTimeoutError(RayError):
        pass

    class RayActorError(RayError):
        actor_init_failed = False

    class ActorUnavailableError(RayActorError):
        pass

    class RayTaskError(RayError):
        pass

    class NodeDiedError(RayError):
        pass


class FakeRay:
    """A fake ``ray`` module: a call's "ref" is the call itself, run by ``get``."""

    exceptions = FakeRayErrors

    def __init__(self) -> None:
        self.killed: list[Any] = []
        self.util = FakeRayUtil()

    def get(self, ref: Callable[[], Any], timeout: float | None = None) -> Any:
        return ref()

    def kill(self, actor: Any) -> None:
        self.killed.append(actor)

    def get_actor(self, name: str, namespace: str = "") -> Any:
        raise ValueError(name)  # gone


class FakeRayUtil:
    """Placement groups by name (a fake of ``ray.util``)."""

    def __init__(self) -> None:
        self.groups: dict[str, str] = {}
        self.removed: list[str] = []

    def get_placement_group(self, name: str) -> str:
        if name not in self.groups:
            raise ValueError(f"no placement group named {name}")
        return self.groups[name]

    def remove_placement_group(self, placement: str) -> None:
        self.removed.append(placement)


class Method:
    def __init__(self, body: Callable[..., Any]) -> None:
        self.body = body

    def options(self, **_: Any) -> Method:
        return self

    def remote(self, *args: Any) -> Callable[[], Any]:
        return lambda: self.body(*args)


class FakeActor:
    """A device actor (a fake): its stage setup fails ``failures`` times, then works."""

    def __init__(self, failures: int = 0, detach: Callable[..., Any] = lambda *_: 0) -> None:
        self.failures = failures
        self.failed = threading.Event()  # a setup failed
        self.setups = 0
        self.closed = 0
        self.ready = Method(lambda: True)
        self.touch = Method(lambda *_: "incarnation-2")
        self.add_stage = Method(self._add_stage)
        self.load = Method(lambda *_: True)
        self.detach = Method(detach)
        self.close = Method(self._close)

    def _add_stage(self, *_: Any) -> None:
        self.setups += 1
        if self.setups <= self.failures:
            self.failed.set()
            raise RuntimeError("the stage's setup failed on the node (fake)")

    def _close(self) -> None:
        self.closed += 1


class FakeBackend:
    """The cluster backend as a host uses it (a fake)."""

    config = None
    door = "this-door"

    def __init__(self, ray: FakeRay) -> None:
        self._ray = ray
        self.healthy = threading.Event()
        self.out: list[str] = []

    def ray(self) -> FakeRay:
        return self._ray

    def node_alive(self, node_id: str) -> bool:
        return True

    def mark_unhealthy(self, device_id: str, reason: str) -> None:
        self.out.append(reason)

    def mark_healthy(self, device_id: str) -> None:
        self.healthy.set()

    def health(self, device_id: str) -> str | None:
        return None

    def forget(self, host: Any) -> None:
        pass


def host_on(
    actor: FakeActor, device: DeviceSpec | None = None
) -> tuple[RayModelHost, FakeBackend, FakeRay]:
    ray = FakeRay()
    backend = FakeBackend(ray)
    host = RayModelHost(backend, device or gpu("cuda:0"))  # type: ignore[arg-type]
    host._handle = actor
    return host, backend, ray


def test_a_heal_that_fails_is_tried_again_until_the_device_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(actor_link, "HEAL_RETRY_S", (0.01,))
    actor = FakeActor(failures=2)
    host, backend, _ = host_on(actor)
    host._plugins = {"encode": object()}  # type: ignore[dict-item]
    host._actor_lost("its actor died (fake)")
    assert backend.healthy.wait(timeout=30)  # readmitted after two failed tries
    assert actor.setups == 3
    assert host.restarts == 1


def test_a_heal_stops_trying_once_the_host_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closed while it waits an hour for its next try, the heal ends at once (the host's
    ``_closed`` event): the join would time out otherwise."""
    monkeypatch.setattr(actor_link, "HEAL_RETRY_S", (3600.0,))
    actor = FakeActor(failures=10**9)
    host, backend, _ = host_on(actor)
    host._plugins = {"encode": object()}  # type: ignore[dict-item]
    host._actor_lost("its actor died (fake)")
    assert actor.failed.wait(timeout=30)  # its first try failed: it waits for the next
    host.close()
    healer = [t for t in threading.enumerate() if t.name.startswith("hetero-heal:")]
    for thread in healer:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in healer) and not backend.healthy.is_set()
    assert actor.setups == 1  # no try after the close


def test_heal_tries_back_off_to_a_long_wait_after_ten_failures() -> None:
    waits = [actor_link.heal_wait_s(tries) for tries in range(12)]
    assert waits[:5] == [1.0, 2.0, 5.0, 10.0, 30.0] and waits[5:9] == [30.0] * 4
    assert waits[9:] == [actor_link.HEAL_SLOW_S] * 3


def test_a_leave_that_times_out_does_not_kill_a_shared_actor() -> None:
    def hangs(*_: Any) -> int:
        raise FakeRayErrors.GetTimeoutError("the leave did not answer (fake)")

    host, _, ray = host_on(FakeActor(detach=hangs))
    host.close()
    assert ray.killed == []  # other front doors may still use it: its lease ends it
    # the controls: the last front door to leave ends it; one with others there does not
    actor = FakeActor(detach=lambda *_: 0)
    host, _, ray = host_on(actor)
    host.close()
    assert ray.killed == [actor] and actor.closed == 1
    host, _, ray = host_on(FakeActor(detach=lambda *_: 1))
    host.close()
    assert ray.killed == []


def test_a_leave_that_finds_the_actor_dead_ends_it_and_frees_its_gpus() -> None:
    """A dead actor runs no reaper: the leaving front door removes its placement group. The
    control: a leave that timed out (the actor may be busy for other doors) removes none."""

    def dead(*_: Any) -> int:
        raise FakeRayErrors.RayActorError("the actor died (fake)")

    def hangs(*_: Any) -> int:
        raise FakeRayErrors.GetTimeoutError("the leave did not answer (fake)")

    group = shape_node([(gpu(f"vllm:cuda:{i}"), ALL) for i in range(2)], {"vllm:cuda": 2}, 4)[0][0]
    name = f"hetero-group:{group.id}"
    actor = FakeActor(detach=dead)
    host, _, ray = host_on(actor, group)
    ray.util.groups[name] = "the group's placement"
    host.close()
    assert ray.killed == [actor] and ray.util.removed == ["the group's placement"]
    host, _, ray = host_on(FakeActor(detach=hangs), group)
    ray.util.groups[name] = "the group's placement"
    host.close()
    assert ray.killed == [] and ray.util.removed == []


def test_an_actor_that_never_answers_leaves_no_placement_group() -> None:
    group = shape_node([(gpu(f"vllm:cuda:{i}"), ALL) for i in range(2)], {"vllm:cuda": 2}, 4)[0][0]
    actor = FakeActor()
    host, _, ray = host_on(actor, group)
    ray.util.groups["pg"] = "the group's placement"
    host._give_up(actor, "pg")
    assert ray.killed == [actor] and ray.util.removed == ["the group's placement"]


class PeerActor:
    """A device actor sharing a GPU (a fake): its lease as it answers it."""

    def __init__(self, state: str) -> None:
        self.lease_state = Method(lambda: state)


def test_the_last_view_of_a_shared_gpu_to_end_removes_its_placement_group() -> None:
    ray = FakeRay()
    peers = ("vllm:cuda:0@node", "sim:x@node")
    actors: dict[str, Any] = {}

    def get_actor(name: str, namespace: str | None = None) -> Any:
        if name not in actors:
            raise ValueError(name)
        return actors[name]

    ray.get_actor = get_actor  # type: ignore[method-assign]
    assert reap.peers_done(ray, peers, None)  # none there: this one is the last
    actors["hetero-lanes:vllm:cuda:0@node"] = PeerActor(reap.LIVE)
    assert not reap.peers_done(ray, peers, None)  # in use: it removes the group when it ends
    actors["hetero-lanes:vllm:cuda:0@node"] = PeerActor(reap.LAPSED)
    assert not reap.peers_done(ray, peers, None)  # ending: it asks in turn once it ended
    actors["hetero-lanes:vllm:cuda:0@node"] = PeerActor(reap.ENDED)
    assert reap.peers_done(ray, peers, None)


def test_a_hung_call_holds_the_lease_no_longer_than_its_limit() -> None:
    lease = reap.Lease(lease_s=1.0, call_limit_s=5.0)
    unlimited = reap.Lease(lease_s=1.0)  # the control: every call in progress holds it
    with lease.present(), unlimited.present():
        now = time.monotonic()
        assert not lease.lapsed(now + 2) and lease.state(now + 2) == reap.LIVE  # a fresh call
        assert lease.lapsed(now + 10) and lease.state(now + 10) == reap.LAPSED  # hung
        assert not unlimited.lapsed(now + 10)
    assert not lease.lapsed(time.monotonic())  # its end touched it
    lease.ended = True
    assert lease.state(time.monotonic()) == reap.ENDED


def test_the_reaper_closes_and_ends_an_actor_whose_lease_lapsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ended: list[tuple[str, ...]] = []
    closed: list[bool] = []
    monkeypatch.setattr(reap, "_end_self", ended.append)
    lease = reap.Lease(lease_s=0.04)  # no front door touches it: it lapses after 0.04 s
    thread = reap.start_reaper("cuda:0@node-fake", lease, lambda: closed.append(True), ("p",))
    thread.join(timeout=30)
    assert closed == [True] and ended == [("p",)] and lease.ended


def test_a_vllm_engine_gets_the_gpus_its_device_names_among_those_it_sees() -> None:
    from hetero.backends.vllm.backend import visible_gpus

    assert visible_gpus("vllm:cuda:1", None) == ["1"]  # one process, every GPU in sight
    assert visible_gpus("vllm:cuda:0+1", None) == ["0", "1"]  # a group: tensor parallel 2
    # in a Ray actor that sees GPUs 2 and 3 only, index 0 is GPU 2 (not the node's GPU 0)
    assert visible_gpus("vllm:cuda:0+1", "2,3") == ["2", "3"]
    assert visible_gpus("vllm:cuda:0", "3") == ["3"]


def test_groups_of_one_size_are_one_kind_for_warming_a_joining_node() -> None:
    from hetero.framework.cluster.joining import kind_of

    four = [(gpu(f"vllm:cuda:{i}"), frozenset({GraphFormat.VLLM})) for i in range(5)]
    shaped = {s.id: s for s, _ in shape_node(four, {"vllm:cuda": 2}, 4)}
    group = shaped[f"vllm:cuda:0+1@{NODE}"]
    assert kind_of(group) == kind_of(shaped[f"vllm:cuda:2+3@{NODE}"])
    assert kind_of(group) != kind_of(shaped[f"vllm:cuda:4@{NODE}"])  # a single GPU is not


def test_a_placement_group_another_front_door_made_meanwhile_is_taken() -> None:
    """Two front doors make a device's named placement group at once: the one whose creation
    fails (the name is taken) takes the other's instead of failing."""
    from hetero.framework.cluster.device_groups import open_placement

    group = shape_node([(gpu(f"vllm:cuda:{i}"), ALL) for i in range(2)], {"vllm:cuda": 2}, 4)[0][0]
    util = FakeRayUtil()
    looks: list[str] = []

    def get(name: str) -> str:
        looks.append(name)
        if len(looks) == 1:
            raise ValueError("none yet")  # not there when first asked
        return "the other door's"

    def create(*_: Any, **__: Any) -> str:
        raise ValueError("a placement group of that name exists (fake)")

    util.get_placement_group = get  # type: ignore[method-assign]
    util.placement_group = create  # type: ignore[attr-defined]
    ray = FakeRay()
    ray.util = util
    assert open_placement(ray, group, "pg", lambda ref: ref) == "the other door's"
    assert looks == ["pg", "pg"]
