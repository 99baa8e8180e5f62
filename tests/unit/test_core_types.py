"""Devices, graphs, stages, pipelines and requests: validation and derived values."""

from __future__ import annotations

import math

import pytest

from hetero.framework.devices import DeviceClass, DeviceSpec, Link, LinkKind, Telemetry
from hetero.framework.errors import CyclicPipelineError, PipelineError
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.stages import Modality, Pipeline, PipelineStep, Request, Stage


def spec(**changes: object) -> DeviceSpec:
    fields: dict[str, object] = {
        "id": "sim:a-0",
        "device_class": "cuda",
        "vendor_name": "A",
        "backend": "sim",
        "host": "h",
        "memory_bytes": 80 * 2**30,
        "peak_flops": {"fp32": 19.5e12, "fp16": 312e12},
        "memory_bandwidth_bytes_per_s": 2.039e12,
    }
    fields.update(changes)
    return DeviceSpec(**fields)  # type: ignore[arg-type]


def test_device_spec_normalises_and_freezes() -> None:
    device = spec(links=[Link("sim:a-1", LinkKind.NVLINK, 300e9)])
    assert device.device_class is DeviceClass.CUDA
    assert device.link_to("sim:a-1") is not None and device.link_to("sim:a-9") is None
    with pytest.raises(TypeError):
        device.peak_flops["fp32"] = 1.0  # type: ignore[index]
    assert device.to_dict()["links"][0]["kind"] == "nvlink"


def test_peak_flops_falls_back_to_fp32() -> None:
    device = spec()
    assert device.peak_flops_for("fp16") == 312e12
    assert device.peak_flops_for("int8") == 19.5e12
    assert spec(peak_flops={"bf16": 5.0, "int8": 9.0}).peak_flops_for("fp16") == 5.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"id": "nocolon"}, "must look like"),
        ({"memory_bytes": 0}, "memory_bytes"),
        ({"peak_flops": {}}, "peak_flops"),
        ({"peak_flops": {"fp32": -1.0}}, "positive"),
        ({"memory_bandwidth_bytes_per_s": 0}, "bandwidth"),
        ({"device_class": "tpu"}, "tpu"),
    ],
)
def test_device_spec_rejects_nonsense(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec(**changes)


def test_telemetry_bounds() -> None:
    assert Telemetry("x:0", memory_used_bytes=1, utilisation=0.5).taken_at > 0
    with pytest.raises(ValueError, match="outside 0-1"):
        Telemetry("x:0", memory_used_bytes=1, utilisation=1.5)


def test_bandwidth_hint_roofline_and_intensity() -> None:
    hint = BandwidthHint(flops_per_item=4e9, bytes_per_item=1e9, max_batch=8)
    assert hint.arithmetic_intensity == 4.0
    assert hint.roofline_seconds(peak_flops=1e12, bandwidth_bytes_per_s=1e11) == 0.01  # memory
    assert hint.roofline_seconds(peak_flops=1e9, bandwidth_bytes_per_s=1e12) == 4.0  # compute
    assert math.isinf(BandwidthHint(flops_per_item=1, bytes_per_item=0).arithmetic_intensity)
    with pytest.raises(ValueError, match="positive integer, got -3"):
        BandwidthHint(flops_per_item=1, bytes_per_item=1, max_batch=-3)
    with pytest.raises(ValueError, match="not batchable"):
        BandwidthHint(flops_per_item=1, bytes_per_item=1, batchable=False, max_batch=4)


def test_torch_graph_needs_a_factory() -> None:
    hint = BandwidthHint(flops_per_item=1, bytes_per_item=1)
    with pytest.raises(ValueError, match="factory"):
        ComputeGraph("g", GraphFormat.TORCH, b"bytes", hint)


def test_stage_light_variant_falls_back_to_full() -> None:
    graph = ComputeGraph("g", "onnx", b"", BandwidthHint(flops_per_item=1, bytes_per_item=1))  # type: ignore[arg-type]
    stage = Stage("ocr", Modality.IMAGE, full=graph)
    assert stage.variant("light") is graph
    with pytest.raises(KeyError):
        stage.variant("medium")


def test_pipeline_orders_a_dag_and_finds_sources_and_sinks() -> None:
    pipeline = Pipeline(
        "q",
        {
            "llm": PipelineStep("llm", after=("vision", "ocr")),
            "vision": PipelineStep("vision"),
            "ocr": PipelineStep("ocr"),
        },
    )
    assert pipeline.order.index("llm") == 2
    assert pipeline.levels[1] == ("llm",) and set(pipeline.levels[0]) == {"vision", "ocr"}
    assert set(pipeline.sources) == {"vision", "ocr"}
    assert pipeline.sinks == ("llm",)


def test_pipeline_rejects_cycles_and_dangling_steps() -> None:
    with pytest.raises(CyclicPipelineError) as caught:
        Pipeline("c", {"a": PipelineStep("a", after=("b",)), "b": PipelineStep("b", after=("a",))})
    assert set(caught.value.cycle) == {"a", "b"}
    with pytest.raises(PipelineError, match="unknown step 'z'"):
        Pipeline("d", {"a": PipelineStep("a", after=("z",))})
    with pytest.raises(PipelineError, match="no steps"):
        Pipeline("e", {})


def test_requests_get_unique_ids() -> None:
    first = Request(route="/r", payload={}, qos_class="standard", principal="u", arrival_time=0.0)
    second = Request(route="/r", payload={}, qos_class="standard", principal="u", arrival_time=0.0)
    assert first.id != second.id
