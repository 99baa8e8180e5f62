"""The conformance tests every backend must pass.

Subclass :class:`BackendConformance` in a test module named ``test_conformance*.py`` and run
``pytest --hetero-backend=NAME``: the ``backend`` fixture and the ``conformance_device``
parameters both come from the backend of that name, built through the registry, so its entry
point is exercised too.
"""

from __future__ import annotations

import logging
import time
from typing import ClassVar

import numpy as np
import pytest

from hetero.framework.backend import Backend
from hetero.framework.conformance.reference_graphs import (
    ReferenceGraph,
    onnxruntime_cpu_outputs,
    reference_graphs,
)
from hetero.framework.devices import DeviceClass
from hetero.framework.errors import (
    CompileError,
    ExecutionError,
    HeteroError,
    UnknownDeviceError,
    UnsupportedCapabilityError,
)
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat

__all__ = ["BackendConformance"]

REFERENCE_GRAPHS = reference_graphs()


def _graph(backend: Backend, ref: ReferenceGraph, device_id: str) -> ComputeGraph:
    """The reference graph in a format ``device_id`` runs (ONNX, else its torch twin)."""
    return ref.graph_for(backend.accepts(GraphFormat.ONNX, device_id))


class BackendConformance:
    """Discovery, telemetry, numerics, memory accounting, error types and graph capture.

    Tests that need a device take the ``conformance_device`` argument, parametrized over every
    device of the backend by the plugin.
    """

    conformance: ClassVar[bool] = True

    # --- discovery ---------------------------------------------------------------------------

    def test_discovery_gives_well_formed_specs(self, backend: Backend) -> None:
        devices = backend.devices()
        assert devices, f"{backend.name} is available but discovered no device"
        ids = [spec.id for spec in devices]
        assert len(set(ids)) == len(ids), f"duplicate device ids: {ids}"
        for spec in devices:
            assert spec.id.startswith(f"{backend.name}:"), spec.id
            assert spec.backend == backend.name
            assert isinstance(spec.device_class, DeviceClass)
            assert spec.vendor_name.strip()
            assert spec.memory_bytes > 0
            assert spec.memory_bandwidth_bytes_per_s > 0
            assert spec.peak_flops and all(v > 0 for v in spec.peak_flops.values())
            for link in spec.links:
                assert link.peer != spec.id, f"{spec.id} links to itself"
                assert link.bandwidth_bytes_per_s > 0
        assert backend.devices() is devices, "discovery must be cached, not repeated"

    def test_unknown_device_is_our_error(self, backend: Backend) -> None:
        with pytest.raises(UnknownDeviceError):
            backend.device(f"{backend.name}:no-such-device")
        with pytest.raises(UnknownDeviceError):
            backend.telemetry(f"{backend.name}:no-such-device")

    # --- telemetry ---------------------------------------------------------------------------

    def test_telemetry_is_sane(self, backend: Backend, conformance_device: str) -> None:
        before = time.time()
        sample = backend.telemetry(conformance_device)
        after = time.time()
        spec = backend.device(conformance_device)
        assert sample.device_id == conformance_device
        assert 0.0 <= sample.utilisation <= 1.0
        assert 0 <= sample.memory_used_bytes <= spec.memory_bytes
        assert sample.power_watts is None or sample.power_watts >= 0
        assert before - 1.0 <= sample.taken_at <= after + 1.0

    # --- numerics ----------------------------------------------------------------------------

    @pytest.mark.parametrize("graph_name", sorted(REFERENCE_GRAPHS))
    def test_reference_graph_matches_onnxruntime_cpu(
        self, backend: Backend, conformance_device: str, graph_name: str
    ) -> None:
        ref = REFERENCE_GRAPHS[graph_name]
        model = backend.load(
            backend.compile(_graph(backend, ref, conformance_device), conformance_device)
        )
        try:
            result = backend.run(model, ref.inputs)
        finally:
            backend.unload(model)
        if not backend.produces_outputs:  # a modelling backend: no numbers, a modelled time
            assert result.outputs == {}
            assert result.latency_s > 0
            return
        expected = onnxruntime_cpu_outputs(ref)
        assert set(result.outputs) == set(expected)
        for name, want in expected.items():
            got = np.asarray(result.outputs[name])
            assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
            assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
            np.testing.assert_allclose(got, want, rtol=ref.rtol, atol=ref.atol, err_msg=name)

    def test_run_reports_measured_latency(self, backend: Backend, conformance_device: str) -> None:
        ref = REFERENCE_GRAPHS["mlp"]
        model = backend.load(
            backend.compile(_graph(backend, ref, conformance_device), conformance_device)
        )
        try:
            first = backend.run(model, ref.inputs)
            backend.run(model, ref.inputs)
        finally:
            backend.unload(model)
        assert first.latency_s > 0
        assert model.latency.runs == 2
        assert model.latency.mean_per_item_s > 0

    # --- memory accounting -------------------------------------------------------------------

    def test_unload_returns_memory_accounting_to_baseline(
        self, backend: Backend, conformance_device: str
    ) -> None:
        baseline = backend.memory_accounted(conformance_device)
        models = [
            backend.load(
                backend.compile(
                    _graph(backend, REFERENCE_GRAPHS[name], conformance_device), conformance_device
                )
            )
            for name in ("mlp", "conv")
        ]
        loaded = backend.memory_accounted(conformance_device)
        assert loaded > baseline, "a load must be accounted"
        assert loaded == baseline + sum(m.memory_bytes for m in models)
        assert {m.handle for m in models} <= {m.handle for m in backend.loaded_models()}
        for model in models:
            backend.unload(model)
        assert backend.memory_accounted(conformance_device) == baseline
        backend.unload(models[0])  # a second unload is a no-op
        assert backend.memory_accounted(conformance_device) == baseline

    # --- errors ------------------------------------------------------------------------------

    def test_malformed_graph_is_a_compile_error(
        self, backend: Backend, conformance_device: str
    ) -> None:
        bad = ComputeGraph(
            "conformance/garbage",
            GraphFormat.ONNX,
            b"this is not an ONNX model",
            BandwidthHint(flops_per_item=1, bytes_per_item=1),
        )
        with pytest.raises(CompileError) as caught:
            backend.load(backend.compile(bad, conformance_device))
        assert caught.value.device == conformance_device
        assert backend.memory_accounted(conformance_device) >= 0

    def test_missing_input_is_an_execution_error(
        self, backend: Backend, conformance_device: str
    ) -> None:
        ref = REFERENCE_GRAPHS["broadcast"]
        model = backend.load(
            backend.compile(_graph(backend, ref, conformance_device), conformance_device)
        )
        try:
            with pytest.raises(ExecutionError):
                backend.run(model, {"a": ref.inputs["a"]})
            result = backend.run(model, ref.inputs)  # the model still works afterwards
            assert set(result.outputs) == ({"y", "z"} if backend.produces_outputs else set())
        finally:
            backend.unload(model)

    def test_running_an_unloaded_model_is_an_execution_error(
        self, backend: Backend, conformance_device: str
    ) -> None:
        ref = REFERENCE_GRAPHS["mlp"]
        model = backend.load(
            backend.compile(_graph(backend, ref, conformance_device), conformance_device)
        )
        backend.unload(model)
        with pytest.raises(ExecutionError):
            backend.run(model, ref.inputs)

    def test_copy_between_devices_preserves_values(self, backend: Backend) -> None:
        ids = [spec.id for spec in backend.devices()]
        pairs = [(src, dst) for src in ids for dst in ids][:16]
        array = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        for src, dst in pairs:
            moved = backend.copy(array, src, dst)
            if hasattr(moved, "cpu"):  # a device tensor (torch): bring it back to compare
                moved = moved.cpu().numpy()
            np.testing.assert_array_equal(np.asarray(moved), array)
        with pytest.raises(HeteroError):
            backend.copy(array, ids[0], f"{backend.name}:no-such-device")

    # --- graph capture -----------------------------------------------------------------------

    def test_unhealthy_marking_is_per_device(
        self, backend: Backend, conformance_device: str
    ) -> None:
        assert backend.health(conformance_device) is None
        backend.mark_unhealthy(conformance_device, "conformance probe")
        try:
            assert backend.health(conformance_device) == "conformance probe"
            others = [d.id for d in backend.devices() if d.id != conformance_device]
            assert all(backend.health(other) is None for other in others)
        finally:
            backend.mark_healthy(conformance_device)
        assert backend.health(conformance_device) is None

    def test_graph_capture_replays_equal_to_eager(
        self,
        backend: Backend,
        conformance_device: str,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        ref = REFERENCE_GRAPHS["mlp"]
        model = backend.load(
            backend.compile(_graph(backend, ref, conformance_device), conformance_device)
        )
        try:
            if not backend.supports_graph_capture:
                with pytest.raises(UnsupportedCapabilityError):
                    backend.capture(model, ref.inputs)
                return
            eager = backend.run(model, ref.inputs).outputs
            with caplog.at_level(logging.WARNING):
                captured = backend.capture(model, ref.inputs)
            if not captured.captured:  # a fallback to eager must say why
                assert "falls back to eager" in caplog.text
            replayed = backend.run(captured, ref.inputs).outputs
            for name, want in eager.items():
                np.testing.assert_allclose(replayed[name], want, rtol=1e-6, atol=1e-6)
        finally:
            backend.unload(model)
