"""The Backend base class: incomplete plugins fail early; vendor errors become ours."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest

from hetero.framework.backend import Arrays, Backend, Executable, LoadedModel
from hetero.framework.devices import DeviceSpec, Telemetry
from hetero.framework.errors import (
    BackendError,
    CompileError,
    DeviceUnhealthyError,
    ExecutionError,
    TransferError,
    UnsupportedCapabilityError,
)
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat

GRAPH = ComputeGraph("g", GraphFormat.ONNX, b"", BandwidthHint(flops_per_item=1, bytes_per_item=1))


class VendorError(Exception):
    """Stands in for a vendor runtime's own exception type."""


class FlakyBackend(Backend):
    """Every hook raises a vendor exception, or succeeds, as the test sets."""

    name: ClassVar[str] = "flaky"
    fail: ClassVar[set[str]] = set()

    def _discover(self) -> list[DeviceSpec]:
        if "discover" in self.fail:
            raise VendorError("driver exploded")
        return [
            DeviceSpec(
                id=f"flaky:{i}",
                device_class="npu",  # type: ignore[arg-type]
                vendor_name="Flaky",
                backend="flaky",
                host="h",
                memory_bytes=1024,
                peak_flops={"fp32": 1.0},
                memory_bandwidth_bytes_per_s=1.0,
            )
            for i in range(2)
        ]

    def _telemetry(self, device_id: str) -> Telemetry:
        raise VendorError("sensor offline")

    def _compile(self, graph: ComputeGraph, device_id: str) -> Any:
        if "compile" in self.fail:
            raise VendorError("unsupported op Foo")
        return "prepared"

    def _load(self, executable: Executable) -> tuple[Any, int]:
        return "loaded", 100

    def _unload(self, model: LoadedModel) -> None:
        pass

    def _run(self, model: LoadedModel, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        raise VendorError("kernel fault\nsecond line of noise")

    def _copy(self, array: np.ndarray[Any, Any], src: str, dst: str) -> np.ndarray[Any, Any]:
        raise VendorError("DMA timeout")


@pytest.fixture
def flaky() -> FlakyBackend:
    FlakyBackend.fail = set()
    return FlakyBackend()


def test_incomplete_backend_fails_at_instantiation() -> None:
    class Incomplete(Backend):
        name = "incomplete"

        def _discover(self) -> list[DeviceSpec]:
            return []

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]


def test_vendor_errors_are_translated_with_context(flaky: FlakyBackend) -> None:
    assert flaky.health("flaky:0") is None
    with pytest.raises(DeviceUnhealthyError, match="sensor offline") as telemetry:
        flaky.telemetry("flaky:0")
    assert isinstance(telemetry.value.__cause__, VendorError)
    assert "sensor offline" in (flaky.health("flaky:0") or "")
    assert flaky.health("flaky:1") is None  # the control: only the failing device is marked
    flaky.mark_healthy("flaky:0")
    assert flaky.health("flaky:0") is None

    FlakyBackend.fail = {"compile"}
    with pytest.raises(CompileError) as compiled:
        flaky.compile(GRAPH, "flaky:0")
    assert compiled.value.device == "flaky:0"
    assert "VendorError: unsupported op Foo" in str(compiled.value)

    FlakyBackend.fail = set()
    model = flaky.load(flaky.compile(GRAPH, "flaky:1"))
    with pytest.raises(ExecutionError) as ran:
        flaky.run(model, {"x": np.zeros(1)})
    # every line of the vendor's message, on one line (framework.faults.describe)
    expected = "running 'g' on flaky:1: VendorError: kernel fault | second line of noise"
    assert str(ran.value) == expected
    assert isinstance(ran.value, RuntimeError)

    with pytest.raises(TransferError) as copied:
        flaky.copy(np.zeros(1), "flaky:0", "flaky:1")
    assert (copied.value.src, copied.value.dst) == ("flaky:0", "flaky:1")


def test_discovery_failure_is_a_backend_error() -> None:
    FlakyBackend.fail = {"discover"}
    with pytest.raises(BackendError, match="device discovery failed: driver exploded"):
        FlakyBackend().devices()


def test_capture_without_the_capability_is_refused(flaky: FlakyBackend) -> None:
    model = flaky.load(flaky.compile(GRAPH, "flaky:0"))
    assert not FlakyBackend.supports_graph_capture
    with pytest.raises(UnsupportedCapabilityError):
        flaky.capture(model, {})


def test_accounting_follows_loads_and_unloads(flaky: FlakyBackend) -> None:
    first = flaky.load(flaky.compile(GRAPH, "flaky:0"))
    flaky.load(flaky.compile(GRAPH, "flaky:1"))
    assert flaky.memory_accounted("flaky:0") == 100
    flaky.close()
    assert flaky.loaded_models() == ()
    assert first.native is None
