"""The Ray mode's device groups, GPU shares, healing retries, leaving and lease reaper, without
Ray (this venv has none): pure functions of ``hetero.framework.cluster.device_groups`` and
``lane_start``, and a device's host over **named fakes** of the ``ray`` module, a device actor
and the cluster backend. ``make test-ray`` runs the real ones (tests/ray/test_device_groups.py:
a placement group over two fake GPUs and the reaper on a real cluster)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from hetero.framework.cluster import actor_link, reap
from hetero.framework.cluster.device_groups import group_bundles, open_group, shape_node
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
    # GPUs 0 and 1 are seen by the group and by the cuda backend: each holds half of each
    assert group.properties["gpu_shares"] == (0.5, 0.5)
    assert gpu_share(shaped[f"cuda:0@{NODE}"][0]) == 0.5
    assert gpu_share(shaped[f"vllm:cuda:2@{NODE}"][0]) == 1.0  # nothing else views GPU 2
    assert group_bundles(group) == [
        {"GPU": 0.5, "hetero/vllm:cuda:0": 0.01},
        {"GPU": 0.5, "hetero/vllm:cuda:1": 0.01},
    ]
    # the group's actor asks for no GPU of its own (its placement group holds them)
    options = lane_options(group, strategy=None)
    assert "num_gpus" not in options and "resources" not in options
    assert lane_options(shaped[f"cuda:1@{NODE}"][0], None)["num_gpus"] == 0.5


def test_without_groups_or_gpus_enough_nothing_is_grouped() -> None:
    ids = {spec.id for spec, _ in node()}
    assert {spec.id for spec, _ in shape_node(node(), {}, 4)} == ids  # the control
    assert {spec.id for spec, _ in shape_node(node(), {"vllm:cuda": 2}, 1)} == ids
    # without groups, a GPU the cuda and vllm backends both view is still shared
    (cuda0,) = [s for s, _ in shape_node(node(), {}, 4) if s.id == f"cuda:0@{NODE}"]
    assert gpu_share(cuda0) == 0.5


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

    def get(self, ref: Callable[[], Any], timeout: float | None = None) -> Any:
        return ref()

    def kill(self, actor: Any) -> None:
        self.killed.append(actor)

    def get_actor(self, name: str, namespace: str = "") -> Any:
        raise ValueError(name)  # gone


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


def host_on(actor: FakeActor) -> tuple[RayModelHost, FakeBackend, FakeRay]:
    ray = FakeRay()
    backend = FakeBackend(ray)
    host = RayModelHost(backend, gpu("cuda:0"))  # type: ignore[arg-type]
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
    monkeypatch.setattr(actor_link, "HEAL_RETRY_S", (0.01,))
    actor = FakeActor(failures=10**9)
    host, backend, _ = host_on(actor)
    host._plugins = {"encode": object()}  # type: ignore[dict-item]
    host._actor_lost("its actor died (fake)")
    host.close()
    healer = [t for t in threading.enumerate() if t.name.startswith("hetero-heal:")]
    for thread in healer:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in healer) and not backend.healthy.is_set()


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


class FakeLeased:
    """A device actor's lease (a fake): lapsed from the third look on."""

    fleet_id = "cuda:0@node-fake"
    lease_s = 0.04

    def __init__(self) -> None:
        self.looks = 0
        self.closed = False

    def lapsed(self, now: float) -> bool:
        self.looks += 1
        return self.looks >= 3

    def close(self) -> None:
        self.closed = True


def test_the_reaper_closes_and_ends_an_actor_whose_lease_lapsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ended: list[bool] = []
    monkeypatch.setattr(reap, "_end_self", lambda: ended.append(True))
    leased = FakeLeased()
    reap.start_reaper(leased).join(timeout=30)
    assert leased.looks == 3 and leased.closed and ended == [True]


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
