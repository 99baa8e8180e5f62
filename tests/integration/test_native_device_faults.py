"""A device fault in a loop a stage drives itself over a native handle (a KV-cache decoder's)
is a device fault: the request is retried on the other device and that (stage, device) breaker
counts it; bad input fails its request with InvalidInputError (a 400) and blames no device.

The devices are the dummy out-of-tree backend's two fake accelerators (tests/plugins/
dummy_backend: no accelerator here); their native handle runs a real ONNX graph step by step on
ONNX's reference evaluator, and raises a real torch CUDA error object at the step the test
chooses (a fake of a GPU that fails mid-decode). The classification is the product's own
(framework/faults.py, through ``native_faults``), as in models/llm.py and models/asr.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from hetero.framework.engine import Engine
from hetero.framework.errors import ExecutionError, InvalidInputError
from hetero.framework.faults import native_faults
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Registry
from hetero.framework.stage_plugin import GraphRunner, StagePlugin, each
from hetero_dummy_backend import DummyBackend, NativeFault, detect

POLICY = """\
version: 1
devices: {allow: [dummy]}
stages:
  decode:
    modality: text
    variants:
      full: {batchable: false, max_batch: 1}
pipelines:
  decode: {steps: [{stage: decode}]}
routes: {/decode: decode}
circuit_breaker:
  device: {window: 4, min_calls: 1, error_rate: 0.5, open_s: 600}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t, queue_bound: 64}}
sla_tiers: {t: {deadline_ms: 60000}}
"""
WIDTH = 8
STEPS = 6
WEIGHT = np.random.default_rng(7).standard_normal((WIDTH, WIDTH)).astype(np.float32) / WIDTH
DEVICES = ("dummy:0", "dummy:1")
OOM = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.19 GiB"


def step_graph() -> bytes:
    """One decoding step: h -> tanh(h @ W), [1, WIDTH] in and out."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["next"])],
        "step",
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("next", TensorProto.FLOAT, [1, WIDTH])],
        initializer=[numpy_helper.from_array(WEIGHT, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


class Decoder(StagePlugin):
    """A stage that drives its own loop on the step graph's native handle, as the LLM's and
    ASR's decoders do, with the runtime calls inside ``native_faults``."""

    name = "decode"

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        hint = BandwidthHint(2.0 * WIDTH * WIDTH, 4.0 * WIDTH * WIDTH, batchable=False)
        graph = ComputeGraph("decode/step", GraphFormat.ONNX, step_graph(), hint, ("h",))
        return {"step": graph}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        native = runner.native("step")
        return each(lambda h: self._decode(runner.device_id, native, h), payloads)

    def _decode(self, device_id: str, native: Any, h: np.ndarray) -> np.ndarray:
        with native_faults(device_id, "decode/step"):
            for _ in range(STEPS):
                (h,) = native.run({"h": h})
        return h


def expected(h: np.ndarray) -> np.ndarray:
    for _ in range(STEPS):
        h = np.tanh(h @ WEIGHT)
    return h


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    monkeypatch.setattr(DummyBackend, "native_fault", None)
    monkeypatch.setattr(DummyBackend, "failing", False)
    registry = Registry(use_entry_points=False)
    registry.register_backend("dummy", detect)
    policy = load_policy_text(POLICY, "native-faults.yaml")
    with Engine(policy, registry, plugins={"decode": Decoder()}, probe=False) as running:
        assert running.warm_up() == {}
        yield running


def sample(engine: Engine, name: str, labels: dict[str, str]) -> float:
    return engine.metrics.registry.get_sample_value(name, labels) or 0.0


def breakers(engine: Engine) -> dict[str, str]:
    return {d: engine.scheduler.breaker("decode", d).state.value for d in DEVICES}


DEVICE_ERRORS: dict[str, Callable[[], Exception]] = {
    "cuda out of memory": lambda: torch.cuda.OutOfMemoryError(OOM),
    "device-side assert": lambda: torch.AcceleratorError("CUDA error: device-side assert"),
}


@pytest.mark.parametrize("make", DEVICE_ERRORS.values(), ids=DEVICE_ERRORS.keys())
def test_a_device_error_mid_decode_is_retried_elsewhere_and_counted_by_the_breaker(
    engine: Engine, make: Callable[[], Exception]
) -> None:
    fault = NativeFault(make(), at_step=STEPS // 2)  # the third of six steps: mid-decode
    DummyBackend.native_fault = fault
    h = np.random.default_rng(1).standard_normal((1, WIDTH)).astype(np.float32)
    result = engine.submit_stage("decode", h).result(timeout=60)
    np.testing.assert_allclose(result.outputs["decode"], expected(h), rtol=1e-5, atol=1e-6)
    (failed,) = fault.fired_on  # the control: the fault really fired, once
    (other,) = set(DEVICES) - {failed}
    assert result.devices["decode"] == other  # retried on the other device, and answered
    assert sample(engine, "hetero_stage_failures_total", {"stage": "decode", "device": failed})
    assert sample(engine, "hetero_stage_retries_total", {"stage": "decode"}) == 1
    assert breakers(engine) == {failed: "open", other: "closed"}  # one failure, counted


def test_a_bad_input_fails_its_request_as_invalid_input_and_opens_nothing(
    engine: Engine,
) -> None:
    DummyBackend.native_fault = NativeFault(RuntimeError("never raised"), at_step=10**6)
    wrong = np.ones((1, WIDTH + 3), np.float32)  # no step graph takes this width
    with pytest.raises(InvalidInputError) as caught:
        engine.submit_stage("decode", wrong).result(timeout=60)
    assert not isinstance(caught.value, ExecutionError)
    assert "decode/step" in str(caught.value)
    assert DummyBackend.native_fault.steps == 1  # it reached the device's loop, and stopped
    for device in DEVICES:
        labels = {"stage": "decode", "device": device}
        assert sample(engine, "hetero_stage_failures_total", labels) == 0
    assert sample(engine, "hetero_stage_retries_total", {"stage": "decode"}) == 0
    assert breakers(engine) == dict.fromkeys(DEVICES, "closed")
    # the engine still serves: a good request right after is answered
    h = np.full((1, WIDTH), 0.5, np.float32)
    result = engine.submit_stage("decode", h).result(timeout=60)
    np.testing.assert_allclose(result.outputs["decode"], expected(h), rtol=1e-5, atol=1e-6)
