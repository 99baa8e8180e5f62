"""Simulated fleets: presets, bad input, the sim backend's modelled durations, topology."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.backends.sim import LlmSequences, SimBackend, modelled_run
from hetero.framework.errors import (
    ExecutionError,
    OutOfDeviceMemoryError,
    PolicyValidationError,
)
from hetero.framework.fleet import simulated_devices
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.policy import load_policy_text
from hetero.framework.topology import Topology

BASE = """\
version: 1
devices:
  simulated:
    - {name: h, preset: H100-SXM5-80GB, count: 2, host: a}
    - {name: m, preset: MI300X, count: 1, host: b}
    - name: x
      class: cpu
      vendor_name: Own numbers
      memory: 64 GB
      memory_bandwidth: 100 GB/s
      peak_flops: {fp32: 1 TFLOPS}
      host: a
stages:
  s:
    modality: text
    variants:
      full:
        {flops_per_item: 1 TFLOPS, bytes_per_item: 20 GB, resident_bytes: 16 GB, max_batch: 8}
qos:
  default_class: c
  classes: {c: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 100}}
"""


def devices() -> list:  # type: ignore[type-arg]
    return simulated_devices(load_policy_text(BASE, "sim.yaml").spec.devices.simulated)


def test_presets_fill_figures_and_explicit_numbers_work() -> None:
    h0, _, m0, x0 = devices()
    assert (h0.id, h0.vendor_name, h0.memory_bytes) == ("sim:h-0", "NVIDIA H100-SXM5-80GB", 80e9)
    assert h0.peak_flops["bf16"] == 989.4e12
    assert h0.link_to("sim:h-1") is not None and h0.link_to("sim:h-1").kind.value == "nvlink"  # type: ignore[union-attr]
    assert m0.device_class.value == "rocm" and m0.memory_bandwidth_bytes_per_s == 5.3e12
    assert x0.vendor_name == "Own numbers" and x0.links == ()


def test_a_preset_figure_can_be_overridden() -> None:
    text = BASE.replace(
        "{name: m, preset: MI300X, count: 1, host: b}", "{name: m, preset: MI300X, memory: 256 GB}"
    )
    (_, _, m0, _) = simulated_devices(load_policy_text(text, "sim.yaml").spec.devices.simulated)
    assert m0.memory_bytes == 256e9
    assert m0.memory_bandwidth_bytes_per_s == 5.3e12


@pytest.mark.parametrize(
    ("old", "new", "line", "key_path", "problem"),
    [
        (
            "preset: MI300X",
            "preset: MI999",
            5,
            "devices.simulated[1].preset",
            "unknown preset 'MI999'",
        ),
        (
            "memory_bandwidth: 100 GB/s",
            "memory_bandwidth: -100 GB/s",
            10,
            "devices.simulated[2].memory_bandwidth",
            "expected a positive number, got '-100 GB/s'",
        ),
        (
            "      vendor_name: Own numbers\n",
            "",
            6,
            "devices.simulated[2]",
            "needs vendor_name (or a preset)",
        ),
        (
            "devices:\n",
            'devices:\n  overrides:\n    "sim:h-0":\n'
            '      links: [{peer: "sim:h-9", kind: nvlink, bandwidth: 1 GB/s}]\n',
            5,
            "devices.overrides.sim:h-0.links[0].peer",
            "link to a missing device 'sim:h-9'",
        ),
        (
            "devices:\n",
            'devices:\n  overrides:\n    "sim:nope-0": {memory: 1 GB}\n',
            4,
            "devices.overrides.sim:nope-0",
            "no simulated device 'sim:nope-0'",
        ),
        (
            "devices:\n",
            "devices:\n  network: {bandwidth: -1}\n",
            3,
            "devices.network.bandwidth",
            "expected a positive number, got -1",
        ),
    ],
)
def test_bad_device_declarations_name_line_and_key(
    old: str, new: str, line: int, key_path: str, problem: str
) -> None:
    assert old in BASE
    with pytest.raises(PolicyValidationError) as caught:
        load_policy_text(BASE.replace(old, new, 1), "sim.yaml")
    assert (caught.value.line, caught.value.key_path) == (line, key_path)
    assert problem in caught.value.problem


def test_modelled_duration_is_the_roofline_for_one_item_and_batching_shares_weights() -> None:
    h0 = devices()[0]
    hint = BandwidthHint(
        flops_per_item=1e12, bytes_per_item=20e9, resident_bytes=16e9, max_batch=8, dtype="fp16"
    )
    one = modelled_run(hint, h0, 1).seconds
    assert one == pytest.approx(20e-6 + max(1e12 / 989.4e12, 20e9 / 3.35e12))
    eight = modelled_run(hint, h0, 8).seconds
    assert eight < 8 * one  # weights are read once per batch
    assert eight == pytest.approx(20e-6 + max(8e12 / 989.4e12, (16e9 + 8 * 4e9) / 3.35e12))


def test_sim_backend_runs_nothing_but_reports_modelled_time_and_accounts_memory() -> None:
    backend = SimBackend(devices())
    hint = BandwidthHint(flops_per_item=1e12, bytes_per_item=20e9, resident_bytes=60e9, max_batch=8)
    graph = ComputeGraph("llm", GraphFormat.VLLM, "some/model", hint, input_names=("tokens",))
    model = backend.load(backend.compile(graph, "sim:h-0"))
    result = backend.run(model, {"tokens": np.zeros((4, 16), np.int64)})
    assert result.outputs == {}
    assert result.latency_s == pytest.approx(
        modelled_run(hint, backend.device("sim:h-0"), 4).seconds
    )
    assert backend.memory_accounted("sim:h-0") == 60e9
    with pytest.raises(OutOfDeviceMemoryError):
        backend.load(backend.compile(graph, "sim:h-0"))  # a second 60 GB model does not fit
    backend.unload(model)
    assert backend.memory_accounted("sim:h-0") == 0


def test_topology_routes_by_size_and_crosses_hosts_by_network() -> None:
    topology = Topology(devices(), network_bandwidth_bytes_per_s=10e9, network_latency_s=10e-6)
    assert [h.kind for h in topology.route(1e6, "sim:h-0", "sim:h-1")] == ["nvlink"]
    assert [h.kind for h in topology.route(1e6, "sim:h-0", "sim:m-0")] == [
        "host",
        "network",
        "host",
    ]
    assert [h.kind for h in topology.route(1e6, "sim:h-0", "sim:x-0")] == ["host", "host"]
    crossing = topology.transfer_time(1e9, "sim:h-0", "sim:m-0")
    assert crossing == pytest.approx((5e-6 + 1e9 / 64e9) * 2 + 10e-6 + 1e9 / 10e9)
    with pytest.raises(KeyError):
        topology.transfer_time(1, "sim:h-0", "sim:zz-0")


def test_an_llm_run_in_the_engine_is_timed_by_the_simulators_formula() -> None:
    """One source: the sim backend times an LLM graph's run (prompt and output tokens per
    sequence) with the same ``modelled_run`` the simulator calls per batch, not the plain
    roofline of a nominal item."""
    backend = SimBackend(devices())
    hint = BandwidthHint(
        flops_per_item=11e12,
        bytes_per_item=120e9,
        resident_bytes=14e9,
        kv_bytes_per_token=524288,
        max_batch=16,
        dtype="fp16",
    )
    graph = ComputeGraph("llm", GraphFormat.VLLM, "some/model", hint, input_names=())
    model = backend.load(backend.compile(graph, "sim:h-0"))
    h0 = backend.device("sim:h-0")
    prompts, outputs = [640, 100, 3000], [128, 32, 8]
    result = backend.run(
        model, {"prompt_tokens": np.array(prompts), "output_tokens": np.array(outputs)}
    )
    expected = modelled_run(hint, h0, 3, LlmSequences(prompts, outputs, 768))
    assert result.latency_s == pytest.approx(expected.seconds)
    assert expected.prefill_s > 0 and expected.decode_s > 0
    plain = 20e-6 + hint.batch_seconds(
        h0.peak_flops_for("fp16"), h0.memory_bandwidth_bytes_per_s, 3
    )
    assert result.latency_s != pytest.approx(plain, rel=0.05)  # control: not the old roofline
    longer = backend.run(
        model, {"prompt_tokens": np.array(prompts), "output_tokens": np.array([256, 32, 8])}
    )
    assert longer.latency_s > result.latency_s  # twice the decode steps for the longest one
    with pytest.raises(ExecutionError, match="prompt_tokens"):
        backend.run(model, {"tokens": np.zeros((3, 16), np.int64)})  # no token counts: named
