"""A stage's outputs kept where they were made (a Ray node's object store), and that place gone
before the next stage reads them: the engine runs the producing step again elsewhere, then the
step that needed it; the request is answered, not failed.

The two devices are a named fake of a cluster's (no Ray in this venv; the real cluster is in
tests/ray/, run by ``make test-ray``): their model hosts keep each output as a
:class:`RemoteValue` tagged with the device that made it, and refuse one whose device left.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pytest

from hetero.framework.backend import Arrays, Backend, Executable, LoadedModel
from hetero.framework.devices import DeviceClass, DeviceSpec, Telemetry
from hetero.framework.engine import Engine
from hetero.framework.engine.device_models import BatchRun
from hetero.framework.engine.outcomes import MAX_INPUT_REDOS
from hetero.framework.errors import InputLostError
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Detection, Registry
from hetero.framework.remote import RemoteValue
from hetero.framework.stage_plugin import GraphRunner, StagePlugin

POLICY = """\
version: 1
devices: {allow: [cpu]}
stages:
  make: {modality: text, variants: {full: {max_batch: 1}}}
  use: {modality: text, variants: {full: {max_batch: 1}}}
pipelines:
  two: {steps: [{stage: make}, {stage: use}]}
routes: {/two: two}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t, queue_bound: 64}}
sla_tiers: {t: {deadline_ms: 60000}}
"""


class Kept(RemoteValue):
    """An output left on the device that made it."""

    def __init__(self, value: np.ndarray, device_id: str) -> None:
        self.value, self.device_id = value, device_id
        self.nbytes, self.shape = int(value.nbytes), tuple(value.shape)

    def fetch(self) -> Any:
        if self.lost:
            raise InputLostError((self.device_id,), "its keeper dropped it for room")
        return self.value

    lost = False


class FarHost:
    """A device's lanes elsewhere: ``make`` keeps x + 1 there, ``use`` reads it and doubles it."""

    def __init__(self, backend: FarBackend, device: DeviceSpec) -> None:
        self.device, self.backend = device, backend

    def load(self, plugin: StagePlugin, model_key: str, graph_format: Any, threads: int) -> bool:
        return True

    def run_batch(
        self,
        plugin: StagePlugin,
        model_key: str,
        graph_format: Any,
        threads: int,
        payloads: list[Any],
    ) -> BatchRun:
        stage = model_key.split("/", 1)[0]
        self.backend.calls.append((stage, self.device.id))
        results: list[Any] = []
        for payload in payloads:
            if stage == "make":
                results.append(Kept(np.asarray(payload["x"]) + 1, self.device.id))
            else:
                kept = payload["make"]
                if self.backend.health(kept.device_id) is not None:
                    results.append(InputLostError((kept.device_id,), "its node left"))
                elif self.backend.inputs_always_dropped:
                    results.append(InputLostError((kept.device_id,), "dropped it for room"))
                else:
                    used = Kept(kept.fetch() * 2, self.device.id)
                    used.lost = self.backend.final_losses > 0
                    self.backend.final_losses -= 1
                    results.append(used if self.backend.keeps_final else used.value)
        if stage == "make" and self.device.id == self.backend.dies_after_make:
            self.backend.dies_after_make = None
            self.backend.mark_unhealthy(self.device.id, "node left the cluster")
        return BatchRun(results, 0.0, 0.001)

    def evict(self, model_key: str) -> None:
        pass

    def resident(self, model_key: str) -> bool:
        return True

    def close(self) -> None:
        pass


class FarBackend(Backend):
    """Two devices on two nodes; far:0 is the faster, so placement tries it first."""

    name: ClassVar[str] = "far"
    supports_model_hosts: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []
        self.dies_after_make: str | None = None
        self.keeps_final = False  # the last stage's output kept on its device too
        self.final_losses = 0  # ... and gone before the response reads it, this many times
        self.inputs_always_dropped = False  # make's output gone whenever use reads it

    def _discover(self) -> list[DeviceSpec]:
        return [
            DeviceSpec(
                id=f"far:{index}",
                device_class=DeviceClass.CPU,
                vendor_name="a node's device (fake)",
                backend=self.name,
                host=f"node-{index}",
                memory_bytes=8 * 2**30,
                peak_flops={"fp32": 1e12 / (1 + 9 * index)},
                memory_bandwidth_bytes_per_s=1e11 / (1 + 9 * index),
            )
            for index in range(2)
        ]

    def model_host(self, device: DeviceSpec) -> FarHost:
        return FarHost(self, device)

    def _telemetry(self, device_id: str) -> Telemetry:
        return Telemetry(device_id=device_id, memory_used_bytes=0, utilisation=0.0)

    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        raise AssertionError("graphs are loaded by the device's host")

    def _load(self, executable: Executable) -> tuple[Any, int]:
        raise AssertionError("graphs are loaded by the device's host")

    def _unload(self, model: LoadedModel) -> None:
        raise AssertionError("graphs are loaded by the device's host")

    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        raise AssertionError("graphs are run by the device's host")


class Step(StagePlugin):
    """A stage whose work its host does."""

    name = "step"

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        hint = BandwidthHint(1e6, 1e6, resident_bytes=2**20)
        return {"main": ComputeGraph(f"{self.stage}/main", GraphFormat.ONNX, b"", hint)}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        raise AssertionError("runs in its host")


@contextlib.contextmanager
def far_engine(backend: FarBackend) -> Iterator[Engine]:
    """An engine over ``backend``'s two devices with the two steps' plugins, warmed up."""
    registry = Registry(use_entry_points=False)
    registry.register_backend("far", lambda: Detection.found("far", lambda: backend))
    plugins = {"make": Step("make"), "use": Step("use")}
    policy = load_policy_text(POLICY, "lost-outputs")
    with Engine(policy, registry, plugins=plugins, probe=False) as engine:
        assert engine.warm_up() == {}
        yield engine


@pytest.mark.parametrize("node_dies", [False, True])
def test_outputs_lost_with_their_node_are_made_again(node_dies: bool) -> None:
    backend = FarBackend()
    with far_engine(backend) as engine:
        backend.dies_after_make = "far:0" if node_dies else None
        result = engine.submit("/two", {"x": np.array([1.0, 2.0])}).result(timeout=60)
        retries = engine.metrics.registry.get_sample_value(
            "hetero_stage_retries_total", {"stage": "use"}
        )
    np.testing.assert_array_equal(result.outputs["use"], [4.0, 6.0])
    if not node_dies:  # the control: made and used on the faster device, once each
        assert backend.calls == [("make", "far:0"), ("use", "far:0")]
        assert not retries
        return
    # far:0 left with make's output: use (on far:1) cannot read it, so make runs again there.
    assert backend.calls == [
        ("make", "far:0"),
        ("use", "far:1"),
        ("make", "far:1"),
        ("use", "far:1"),
    ]
    assert result.devices == {"make": "far:1", "use": "far:1"}
    assert retries == 1


@pytest.mark.parametrize("losses", [0, 1, MAX_INPUT_REDOS + 1])
def test_a_final_output_that_cannot_be_fetched_is_made_again(losses: int) -> None:
    """The response reads the last stage's output from where it was kept; gone by then (its
    keeper died or dropped it for room), the step that made it runs again and the request is
    answered; lost every time, the request fails with the reason after MAX_INPUT_REDOS redos,
    and the device's lane goes on serving: the next request is answered. The control (0
    losses): one run of each step."""
    backend = FarBackend()
    backend.keeps_final = True
    with far_engine(backend) as engine:
        backend.final_losses = losses
        future = engine.submit("/two", {"x": np.array([1.0])})
        if losses > MAX_INPUT_REDOS:
            with pytest.raises(InputLostError, match="dropped it for room"):
                future.result(timeout=30)
        else:
            np.testing.assert_array_equal(future.result(timeout=30).outputs["use"], [4.0])
        runs_of_use = backend.calls.count(("use", "far:0"))
        backend.final_losses = 0
        result = engine.submit("/two", {"x": np.array([1.0])}).result(timeout=30)
        failed = engine.metrics.registry.get_sample_value(
            "hetero_engine_requests_total", {"route": "/two", "outcome": "failed"}
        )
        retries = engine.metrics.registry.get_sample_value(
            "hetero_stage_retries_total", {"stage": "use"}
        )
    np.testing.assert_array_equal(result.outputs["use"], [4.0])
    assert runs_of_use == min(losses, MAX_INPUT_REDOS) + 1
    assert (retries or 0) == min(losses, MAX_INPUT_REDOS)
    assert (failed or 0) == (1 if losses > MAX_INPUT_REDOS else 0)


@pytest.mark.parametrize("always_dropped", [False, True])
def test_a_request_whose_inputs_keep_being_lost_fails_after_its_redos(
    always_dropped: bool,
) -> None:
    """Inputs dropped every time the next stage reads them: the producing step runs again
    MAX_INPUT_REDOS times, then the request fails with the loss instead of looping; the
    control (kept inputs) is answered after one run of each step."""
    backend = FarBackend()
    with far_engine(backend) as engine:
        backend.inputs_always_dropped = always_dropped
        future = engine.submit("/two", {"x": np.array([1.0])})
        if always_dropped:
            with pytest.raises(InputLostError, match="dropped it for room"):
                future.result(timeout=30)
        else:
            np.testing.assert_array_equal(future.result(timeout=30).outputs["use"], [4.0])
        retries = engine.metrics.registry.get_sample_value(
            "hetero_stage_retries_total", {"stage": "use"}
        )
    runs = MAX_INPUT_REDOS + 1 if always_dropped else 1
    assert backend.calls == [("make", "far:0"), ("use", "far:0")] * runs
    assert (retries or 0) == (MAX_INPUT_REDOS if always_dropped else 0)
