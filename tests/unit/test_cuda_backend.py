"""CudaBackend on a host without a GPU: discovery and telemetry replayed through FakeNvml (a
named fake for absent hardware), and the torch executor's code run for real on the CPU."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
from fake_nvml import FakeNvml, recorded

from hetero.backends.cuda.backend import CudaBackend
from hetero.framework.errors import CompileError, DeviceUnhealthyError
from hetero.framework.executors.torch_executor import TorchExecutor, outputs_by_name
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat

HINT = BandwidthHint(flops_per_item=1, bytes_per_item=1)


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml(recorded("nvml_dgx_a100"))


def test_discovery_reads_every_gpu_through_nvml(fake: FakeNvml) -> None:
    backend = CudaBackend(nvml=fake)
    ids = [spec.id for spec in backend.devices()]
    assert ids == [f"cuda:{i}" for i in range(8)]
    assert backend.devices()[0].vendor_name == "NVIDIA A100-SXM4-80GB"
    assert fake.initialised == 1


def test_a_gpu_lost_mid_run_is_marked_unhealthy_and_nothing_else_breaks(fake: FakeNvml) -> None:
    backend = CudaBackend(nvml=fake)
    assert backend.telemetry("cuda:2").utilisation == pytest.approx(0.2)
    fake.lost.add(2)
    with pytest.raises(DeviceUnhealthyError, match="GPU is lost"):
        backend.telemetry("cuda:2")
    assert "GPU is lost" in (backend.health("cuda:2") or "")
    assert backend.health("cuda:1") is None  # the control
    assert backend.telemetry("cuda:1").device_id == "cuda:1"


def test_onnx_without_the_cuda_provider_is_a_clear_compile_error(fake: FakeNvml) -> None:
    backend = CudaBackend(nvml=fake)
    graph = ComputeGraph("g", GraphFormat.ONNX, b"onnx", HINT)
    with pytest.raises(CompileError, match="onnxruntime-gpu"):
        backend.compile(graph, "cuda:0")


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


class Wrapped(torch.nn.Module):
    """Takes a named input, as the executor calls modules with keyword arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()

    def forward(self, x: torch.Tensor) -> Any:
        y = self.body(x)
        return {"y": y, "argmax": y.argmax(dim=-1)}


def test_torch_executor_loads_runs_and_unloads_on_the_cpu() -> None:
    executor = TorchExecutor("cpu")
    module = executor.prepare(Wrapped)
    loaded, size = executor.load(module)
    assert size == sum(p.numel() * 4 for p in loaded.parameters())
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    out = executor.run(loaded, {"x": x})
    with torch.no_grad():
        want = Wrapped.__call__(loaded, torch.from_numpy(x))["y"].numpy()
    np.testing.assert_allclose(out["y"], want, rtol=1e-6)
    assert out["argmax"].dtype == np.int64
    executor.unload(loaded)
    assert next(loaded.parameters()).device.type == "meta"  # the weights are really gone


def test_capture_falls_back_to_eager_with_a_reason_without_a_gpu() -> None:
    executor = TorchExecutor("cpu")
    loaded, _ = executor.load(executor.prepare(Wrapped))
    captured, reason = executor.capture(loaded, {"x": np.zeros((2, 8), np.float32)})
    assert captured is None
    assert "no CUDA/HIP device" in reason


def test_prepare_refuses_what_is_not_a_module() -> None:
    with pytest.raises(TypeError, match=r"not a torch\.nn\.Module"):
        TorchExecutor("cpu").prepare(lambda: "nope")


def test_outputs_by_name() -> None:
    assert set(outputs_by_name(torch.ones(2))) == {"output"}
    assert set(outputs_by_name((torch.ones(1), torch.zeros(1)))) == {"output_0", "output_1"}


def test_backend_capture_of_an_onnx_session_logs_its_fallback(
    fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    from hetero.framework.backend import LoadedModel

    backend = CudaBackend(nvml=fake)
    model = LoadedModel(
        graph=ComputeGraph("g", GraphFormat.ONNX, b"", HINT),
        device_id="cuda:0",
        memory_bytes=1,
        native=("onnx", object(), None),
    )
    with caplog.at_level(logging.WARNING):
        same = backend._capture(model, {})
    assert same is model and not model.captured
    assert "falls back to eager" in caplog.text
