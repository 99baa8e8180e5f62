"""The engine on the real npu backend: a two-stage pipeline of real ONNX graphs, batching,
failure injection (a backend that raises on demand), timeouts and bad input."""

from __future__ import annotations

import json
import threading
from concurrent.futures import wait
from typing import Any, ClassVar

import numpy as np
import pytest

from hetero.backends.npu import NpuBackend
from hetero.framework.backend import Arrays, LoadedModel
from hetero.framework.engine import Engine
from hetero.framework.errors import (
    NoEligibleDeviceError,
    RequestTimeoutError,
    ShedError,
    UnknownRouteError,
)
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.registry import Detection, Registry
from hetero.framework.scheduler import RequestProfile, StageTask

OPENVINO = "npu:openvino/CPU"
ORT = "npu:onnxruntime/CPUExecutionProvider"

POLICY = """\
version: 1
devices: {allow: [npu]}
stages:
  encode:
    modality: text
    variants:
      full: {flops_per_item: 1 MFLOPS, bytes_per_item: 10 kB, resident_bytes: 4 kB,
             max_batch: 8, max_delay_ms: 2}
      light: {flops_per_item: 0.5 MFLOPS, bytes_per_item: 5 kB, resident_bytes: 4 kB, max_batch: 8}
  head:
    modality: embedding
    variants:
      full: {flops_per_item: 1 MFLOPS, bytes_per_item: 10 kB, resident_bytes: 1 kB,
             max_batch: 8, max_delay_ms: 2}
pipelines:
  two: {steps: [{stage: encode}, {stage: head}]}
routes: {/two: two}
circuit_breaker:
  complexity: {degrade_at: 0.5}
  device: {window: 4, min_calls: 2, error_rate: 0.5, open_s: 60}
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: t, queue_bound: 64}}
sla_tiers: {t: {deadline_ms: 5000}}
"""

RNG = np.random.default_rng(3)
W1 = RNG.standard_normal((16, 32)).astype(np.float32)
W2 = RNG.standard_normal((32, 4)).astype(np.float32)


def matmul_graph(name: str, weight: np.ndarray, src: str, dst: str, relu: bool) -> ComputeGraph:
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("MatMul", [src, "w"], ["mm" if relu else dst])]
    if relu:
        nodes.append(helper.make_node("Relu", ["mm"], [dst]))
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(src, TensorProto.FLOAT, ["N", weight.shape[0]])],
        [helper.make_tensor_value_info(dst, TensorProto.FLOAT, ["N", weight.shape[1]])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    hint = BandwidthHint(
        flops_per_item=2 * weight.size, bytes_per_item=4 * weight.size, max_batch=8
    )
    return ComputeGraph(name, GraphFormat.ONNX, model.SerializeToString(), hint, input_names=(src,))


GRAPHS = {
    "encode/full": matmul_graph("encode", W1, "x", "h", relu=True),
    "head/full": matmul_graph("head", W2, "h", "y", relu=False),
}


class FlakyNpuBackend(NpuBackend):
    """The real npu backend, with runs on some devices made to fail on demand (fault injection)."""

    failing: ClassVar[set[str]] = set()
    runs: ClassVar[dict[str, int]] = {}
    lock = threading.Lock()

    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        with self.lock:
            self.runs[model.device_id] = self.runs.get(model.device_id, 0) + 1
        if model.device_id in self.failing:
            raise RuntimeError("injected device fault")
        return super()._run(model, inputs)


def flaky_registry() -> Registry:
    registry = Registry(use_entry_points=False)
    registry.register_backend("npu", lambda: Detection.found("npu", FlakyNpuBackend))
    FlakyNpuBackend.failing = set()
    FlakyNpuBackend.runs = {}
    return registry


def expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W1, 0) @ W2


def test_two_stage_pipeline_runs_on_real_onnx_graphs() -> None:
    policy = load_policy_text(POLICY, "engine.yaml")
    with Engine(policy, flaky_registry(), GRAPHS) as engine:
        x = RNG.standard_normal((3, 16)).astype(np.float32)
        result = engine.run("/two", {"x": x}, timeout=60)
        np.testing.assert_allclose(result.outputs["head"]["y"], expected(x), rtol=1e-4, atol=1e-4)
        assert set(result.devices) == {"encode", "head"}
        assert not result.degraded
        text = engine.metrics.registry.get_sample_value(
            "hetero_engine_requests_total", {"route": "/two", "outcome": "ok"}
        )
        assert text == 1.0


def test_concurrent_requests_are_batched_and_all_answered() -> None:
    policy = load_policy_text(POLICY, "engine.yaml")
    with Engine(policy, flaky_registry(), GRAPHS) as engine:
        inputs = [RNG.standard_normal((1, 16)).astype(np.float32) for _ in range(24)]
        futures = [engine.submit("/two", {"x": x}) for x in inputs]
        _done, not_done = wait(futures, timeout=60)
        assert not not_done
        for x, future in zip(inputs, futures, strict=True):
            np.testing.assert_allclose(
                future.result().outputs["head"]["y"], expected(x), rtol=1e-4, atol=1e-4
            )
        items = engine.metrics.registry.get_sample_value(
            "hetero_batch_size_sum", {"stage": "encode"}
        )
        assert items == 24  # every item ran exactly once, batched or not


def test_a_device_that_fails_mid_run_loses_no_request() -> None:
    policy = load_policy_text(POLICY, "engine.yaml")
    registry = flaky_registry()
    with Engine(policy, registry, GRAPHS, placement="round_robin") as engine:
        warm = RNG.standard_normal((1, 16)).astype(np.float32)
        engine.run("/two", {"x": warm}, timeout=60)
        FlakyNpuBackend.failing = {OPENVINO}  # the fault starts mid-run
        inputs = [RNG.standard_normal((2, 16)).astype(np.float32) for _ in range(20)]
        futures = [engine.submit("/two", {"x": x}) for x in inputs]
        _done, not_done = wait(futures, timeout=120)
        assert not not_done
        for x, future in zip(inputs, futures, strict=True):
            result = future.result()  # every request completed elsewhere
            np.testing.assert_allclose(
                result.outputs["head"]["y"], expected(x), rtol=1e-4, atol=1e-4
            )
            assert set(result.devices.values()) == {ORT}
        assert FlakyNpuBackend.runs.get(OPENVINO, 0) > 0  # the control: the fault really fired
        sample = engine.metrics.registry.get_sample_value
        assert (
            sample("hetero_stage_failures_total", {"stage": "encode", "device": OPENVINO}) or 0
        ) + (sample("hetero_stage_failures_total", {"stage": "head", "device": OPENVINO}) or 0) > 0
        assert engine.scheduler.breaker("encode", OPENVINO).state.value in {"open", "half_open"}


def test_when_every_device_fails_the_request_fails() -> None:
    policy = load_policy_text(POLICY, "engine.yaml")
    with Engine(policy, flaky_registry(), GRAPHS) as engine:
        FlakyNpuBackend.failing = {OPENVINO, ORT}
        future = engine.submit("/two", {"x": np.ones((1, 16), np.float32)})
        with pytest.raises((RuntimeError, NoEligibleDeviceError)) as caught:
            future.result(timeout=60)
        assert "injected device fault" in str(caught.value) or "breaker" in str(caught.value)


def test_unknown_route_and_unknown_class_are_clear_errors() -> None:
    policy = load_policy_text(POLICY, "engine.yaml")
    with Engine(policy, flaky_registry(), GRAPHS) as engine:
        with pytest.raises(UnknownRouteError, match="unknown route '/nope'"):
            engine.submit("/nope", {})
        with pytest.raises(KeyError, match="unknown QoS class 'gold'"):
            engine.submit("/two", {"x": np.ones((1, 16), np.float32)}, qos_class="gold")


def test_a_stage_without_a_runnable_graph_is_rejected_with_reasons() -> None:
    policy = load_policy_text(POLICY, "engine.yaml")
    graphs = {"encode/full": GRAPHS["encode/full"]}  # no graph for the head stage
    with Engine(policy, flaky_registry(), graphs) as engine:
        future = engine.submit("/two", {"x": np.ones((1, 16), np.float32)})
        with pytest.raises(NoEligibleDeviceError, match="cannot run this variant"):
            future.result(timeout=60)


def test_heavy_requests_are_degraded_or_shed() -> None:
    policy = load_policy_text(POLICY, "engine.yaml")
    with Engine(policy, flaky_registry(), GRAPHS) as engine:
        x = np.ones((1, 16), np.float32)
        small = RequestProfile(text_tokens=100)
        for _ in range(3):  # measures the stage's pace per complexity unit
            assert not engine.run("/two", {"x": x}, timeout=60, profile=small).degraded
        pace = engine.admission.pace("encode")
        assert pace.unit_s > 0 and pace.item_s > 0
        # 5 s deadline: a request estimated past half of it runs light while work is queued,
        # one past all of it is shed with a Retry-After; an idle stage admits anything.
        heavy = RequestProfile(text_tokens=int(100 * 3.0 / (pace.unit_s * 0.1)))
        huge = RequestProfile(text_tokens=int(100 * 60.0 / (pace.unit_s * 0.1)))
        assert engine.admit("encode", None, huge) == ("full", "")
        running = StageTask("t", "encode", "encode", "full", "standard", 0.0, 1.0)
        engine.admission.started(running)  # as if a batch were running (test only)
        try:
            variant, reason = engine.admit("encode", None, heavy)
            assert variant == "light" and "of the deadline" in reason
            with pytest.raises(ShedError) as caught:
                engine.submit("/two", {"x": x}, profile=huge)
        finally:
            engine.admission.finished(running)
        assert caught.value.status == 429 and caught.value.retry_after_s >= 1.0
        assert "deadline" in str(caught.value)


def test_a_request_that_times_out_is_cancelled_and_the_engine_carries_on() -> None:
    policy = load_policy_text(POLICY, "engine.yaml")
    gate = threading.Event()

    class GatedBackend(FlakyNpuBackend):
        def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
            gate.wait(timeout=30)  # holds the run until the test opens it
            return super()._run(model, inputs)

    registry = Registry(use_entry_points=False)
    registry.register_backend("npu", lambda: Detection.found("npu", GatedBackend))
    with Engine(policy, registry, GRAPHS) as engine:
        x = np.ones((1, 16), np.float32)
        with pytest.raises(RequestTimeoutError):
            engine.run("/two", {"x": x}, timeout=0.05)
        gate.set()
        result = engine.run("/two", {"x": x}, timeout=60)  # the engine still works
        np.testing.assert_allclose(result.outputs["head"]["y"], expected(x), rtol=1e-4, atol=1e-4)
        cancelled = engine.metrics.registry.get_sample_value(
            "hetero_engine_requests_total", {"route": "/two", "outcome": "cancelled"}
        )
        assert cancelled == 1.0


ONE_DEVICE = POLICY.replace("devices: {allow: [npu]}", 'devices: {allow: ["npu:onnxruntime/*"]}')


def gated_registry(gate: threading.Event) -> Registry:
    class GatedBackend(FlakyNpuBackend):
        def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
            gate.wait(timeout=30)  # holds runs until the test opens the gate
            return super()._run(model, inputs)

    registry = Registry(use_entry_points=False)
    registry.register_backend("npu", lambda: Detection.found("npu", GatedBackend))
    FlakyNpuBackend.failing = set()
    return registry


def test_cancelling_one_request_spares_those_batched_with_it() -> None:
    gate = threading.Event()
    policy = load_policy_text(ONE_DEVICE, "engine.yaml")
    with Engine(policy, gated_registry(gate), GRAPHS) as engine:
        x = np.ones((1, 16), np.float32)
        first = engine.submit("/two", {"x": x})
        second = engine.submit("/two", {"x": x})
        third = engine.submit("/two", {"x": x})
        assert second.cancel()  # the caller gives up on one while the device is busy
        gate.set()
        for future in (first, third):
            np.testing.assert_allclose(
                future.result(timeout=60).outputs["head"]["y"], expected(x), rtol=1e-4, atol=1e-4
            )
        assert second.cancelled()
        sample = engine.metrics.registry.get_sample_value
        assert sample("hetero_stage_failures_total", {"stage": "encode", "device": ORT}) is None
        assert engine.scheduler.breaker("encode", ORT).state.value == "closed"
        assert engine.run("/two", {"x": x}, timeout=60).outputs  # the worker is alive


def test_submit_after_close_is_refused_with_503() -> None:
    policy = load_policy_text(POLICY, "engine.yaml")
    engine = Engine(policy, flaky_registry(), GRAPHS).start()
    engine.close()
    with pytest.raises(ShedError) as caught:
        engine.submit("/two", {"x": np.ones((1, 16), np.float32)})
    assert caught.value.status == 503


def test_when_every_device_fails_the_error_names_each_failure() -> None:
    policy = load_policy_text(POLICY, "engine.yaml")
    with Engine(policy, flaky_registry(), GRAPHS) as engine:
        FlakyNpuBackend.failing = {OPENVINO, ORT}
        future = engine.submit("/two", {"x": np.ones((1, 16), np.float32)})
        with pytest.raises(NoEligibleDeviceError) as caught:
            future.result(timeout=60)
        message = str(caught.value)
        assert OPENVINO in message and ORT in message
        assert "injected device fault" in message


def test_a_device_its_backend_marks_unhealthy_leaves_placement() -> None:
    policy = load_policy_text(POLICY, "engine.yaml")
    with Engine(policy, flaky_registry(), GRAPHS, placement="round_robin") as engine:
        x = np.ones((1, 16), np.float32)
        engine.run("/two", {"x": x}, timeout=60)
        engine.backends["npu"].mark_unhealthy(OPENVINO, "telemetry failed: GPU is lost")
        engine.run("/two", {"x": x}, timeout=60)  # the next batch report syncs health
        results = [engine.run("/two", {"x": x}, timeout=60) for _ in range(6)]
        assert all(set(r.devices.values()) == {ORT} for r in results)


def test_a_repeated_request_is_answered_from_the_feature_cache(tmp_path: Any) -> None:
    from cache_worker import cache_config

    from hetero.cache import FeatureCache, StageOutputCache

    policy = load_policy_text(POLICY, "engine.yaml")
    features = FeatureCache(cache_config(None), directory=tmp_path / "cache")
    try:
        with Engine(policy, flaky_registry(), GRAPHS, cache=StageOutputCache(features)) as engine:
            x = RNG.standard_normal((2, 16)).astype(np.float32)
            first = engine.run("/two", {"x": x}, timeout=60)
            runs = dict(FlakyNpuBackend.runs)
            again = engine.run("/two", {"x": x}, timeout=60)
            assert FlakyNpuBackend.runs == runs  # no device ran anything the second time
            assert again.devices == {"encode": "cache", "head": "cache"}
            np.testing.assert_allclose(again.outputs["head"]["y"], first.outputs["head"]["y"])
            other = engine.run("/two", {"x": x + 1}, timeout=60)  # the control: new content runs
            assert set(other.devices.values()) != {"cache"}
            np.testing.assert_allclose(
                other.outputs["head"]["y"], expected(x + 1), rtol=1e-4, atol=1e-4
            )
    finally:
        features.close()


SENSITIVE_POLICY = (
    POLICY.replace(
        "  encode:\n    modality: text\n",
        "  encode:\n    modality: text\n    partition: letters\n",
    )
    + """partitions:
  letters:
    modality: text
    classification: confidential
    cipher: AES-256-GCM
    key: file:letters
    isolation: process
    roles: [clerk]
"""
)


def test_a_sensitive_step_is_checked_and_audited_before_it_is_queued(tmp_path: Any) -> None:
    from hetero.sandbox import AuditLog, Principal
    from hetero.sandbox.audit import load_or_create_signing_key
    from hetero.sandbox.gate import AccessDeniedError, ComplianceGate

    policy = load_policy_text(SENSITIVE_POLICY, "sensitive.yaml")
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    with (
        Engine(policy, flaky_registry(), GRAPHS) as ungated,
        pytest.raises(PermissionError, match="no compliance gate"),
    ):
        ungated.submit("/two", {"x": x})
    audit = AuditLog(tmp_path / "audit.log", load_or_create_signing_key(tmp_path / "k.pem"))
    gate = ComplianceGate(policy, audit)
    with Engine(policy, flaky_registry(), GRAPHS, gate=gate) as engine:
        with pytest.raises(AccessDeniedError, match=r"partitions\.letters\.roles"):
            engine.submit("/two", {"x": x}, principal=Principal("eve", frozenset({"guest"})))
        clerk = Principal("ann", frozenset({"clerk"}))
        result = engine.submit("/two", {"x": x}, principal=clerk).result(timeout=60)
        np.testing.assert_allclose(result.outputs["head"]["y"], expected(x), rtol=1e-4, atol=1e-4)
    records = [json.loads(line) for line in audit.path.read_text().splitlines()]
    assert [(r["principal"], r["decision"]) for r in records] == [("eve", "deny"), ("ann", "allow")]
    assert sum(FlakyNpuBackend.runs.values()) >= 1  # only the allowed request ran
