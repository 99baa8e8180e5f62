"""The `hetero` command as a user runs it: real subprocesses, real backends, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HETERO = str(Path(sys.executable).parent / "hetero")


def hetero(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **(env or {})}
    return subprocess.run(
        [HETERO, *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=120,
    )


def test_devices_json_lists_the_cpu_through_both_runtimes_and_gpu_reasons() -> None:
    result = hetero("devices", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    ids = {device["id"] for device in payload["devices"]}
    assert {"npu:openvino/CPU", "npu:onnxruntime/CPUExecutionProvider"} <= ids
    assert not any(i.startswith("dummy:") for i in ids), "test plugins stay out of the real venv"
    cpu = next(d for d in payload["devices"] if d["id"] == "npu:openvino/CPU")
    assert cpu["class"] == "cpu" and cpu["memory_bytes"] > 0 and cpu["peak_flops"]["fp32"] > 0
    if not Path("/dev/nvidiactl").exists():
        assert payload["unavailable"]["cuda"] == "NVML library not found"
    if not Path("/dev/kfd").exists():
        assert payload["unavailable"]["rocm"] == "amdsmi library not found"


def test_devices_table_for_people_adds_one_line_per_unavailable_backend() -> None:
    result = hetero("devices")
    assert result.returncode == 0, result.stderr
    unavailable = json.loads(hetero("devices", "--json").stdout)["unavailable"]
    assert unavailable  # no host here has both a CUDA and a ROCm driver
    for name, reason in unavailable.items():
        assert f"{name}: {reason}" in result.stdout.splitlines()


def test_plan_default_policy() -> None:
    result = hetero("plan", "policies/default.yaml", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["valid"] is True and payload["source"] == "policies/default.yaml"
    stages = {stage["stage"] for stage in payload["stages"]}
    assert {"vision_encode", "ocr", "asr", "tts", "text_embed", "llm_generate"} <= stages
    human = hetero("plan", "policies/default.yaml")
    assert human.returncode == 0, human.stderr
    assert "is valid" in human.stdout


def test_json_output_stays_plain_when_colour_is_forced() -> None:
    forced = {"FORCE_COLOR": "1"}
    result = hetero("plan", "policies/sim/8xa100.yaml", "--json", env=forced)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["policy"] == "8xa100"
    control = hetero("plan", "policies/sim/8xa100.yaml", env=forced)
    assert "\x1b[" in control.stdout  # the tables for people are coloured


def test_plan_json_for_a_simulated_fleet() -> None:
    result = hetero("plan", "policies/sim/mixed-fleet.yaml", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["simulated"] is True
    classes = {d["class"] for d in payload["devices"]}
    assert classes == {"cuda", "rocm", "npu", "cpu"}
    llm = next(s for s in payload["stages"] if s["stage"] == "llm_decode")
    assert {d["id"].split("-")[0] for d in llm["devices"]} == {"sim:a100", "sim:h100", "sim:mi300x"}
    assert all("not allowed" in i["reason"] for i in llm["ineligible"])


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ("max_batch: 4\n      light:", "max_batch: -3\n      light:"),
            ":27: stages.ocr.variants.full.max_batch: expected a positive integer, got -3",
        ),
        (("  ocr:\n", "  ocr:\n   - x: [\n"), ": YAML syntax error"),
    ],
)
def test_bad_policy_exits_2_with_one_clear_line(
    tmp_path: Path, edit: tuple[str, str], expected: str
) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text((REPO / "policies" / "default.yaml").read_text().replace(*edit, 1))
    result = hetero("plan", str(bad))
    assert result.returncode == 2
    assert result.stdout == ""
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = hetero("--debug", "plan", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2
    assert "Traceback" in result.stderr
    assert "policy file not found" in result.stderr


def test_missing_policy_and_bad_arguments_exit_2(tmp_path: Path) -> None:
    missing = hetero("plan", str(tmp_path / "absent.yaml"))
    assert missing.returncode == 2
    assert f"{tmp_path / 'absent.yaml'}: policy file not found" in missing.stderr
    assert hetero("plan").returncode == 2
    assert hetero("frobnicate").returncode == 2
    uneven = hetero("bench", "scheduler", "--devices", "12")
    assert uneven.returncode == 2
    assert "--devices: hosts of 8 devices, got 12" in uneven.stderr


def test_bad_environment_variable_exits_2() -> None:
    result = hetero("devices", env={"HETERO_BACKEND_AUTOLOAD": "perhaps"})
    assert result.returncode == 2
    assert "HETERO_BACKEND_AUTOLOAD" in result.stderr


def test_version() -> None:
    result = hetero("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("hetero 0.")


def test_devices_of_a_simulated_policy_with_topology() -> None:
    result = hetero("devices", "--policy", "policies/sim/mixed-fleet.yaml", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["simulated"] is True
    assert len(payload["devices"]) == 9
    routes = {(p["src"], p["dst"]): p["route"] for p in payload["topology"]["pairs"]}
    assert routes[("sim:a100-0", "sim:a100-1")] == ["nvlink"]
    assert routes[("sim:mi300x-0", "sim:mi300x-1")] == ["xgmi"]
    assert ("sim:a100-0", "sim:mi300x-0") not in routes  # two hosts: host to host, below
    assert set(payload["topology"]["hosts"]) == {d["host"] for d in payload["devices"]}
    assert payload["topology"]["network"]["route"] == ["network"]
    a100 = hetero("devices", "--policy", "policies/sim/8xa100.yaml", "--json")
    assert a100.returncode == 0, a100.stderr
    pairs = json.loads(a100.stdout)["topology"]["pairs"]
    assert len(pairs) == 8 * 7
    assert {(p["route"][0], p["bandwidth_bytes_per_s"]) for p in pairs} == {("nvlink", 300e9)}
    table = hetero("devices", "--policy", "policies/sim/8xa100.yaml")
    assert table.returncode == 0, table.stderr


def test_devices_with_a_bad_policy_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "sim.yaml"
    text = (REPO / "policies" / "sim" / "8xa100.yaml").read_text()
    bad.write_text(text.replace("preset: A100-SXM4-80GB", "preset: A100-SXM9"))
    result = hetero("devices", "--policy", str(bad))
    assert result.returncode == 2
    assert "devices.simulated[0].preset: unknown preset 'A100-SXM9'" in result.stderr


def test_bench_scheduler_json_reports_every_queue_length_side_by_side() -> None:
    result = hetero("bench", "scheduler", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert [row["queued"] for row in payload["results"]] == [100, 1000, 10000]
    for row in payload["results"]:
        assert row["hetero"]["p99_us"] > 0 and row["naive"]["p99_us"] > 0
        # CPU time of a decision is reported beside its wall time, and is ordered p50 <= p99.
        assert 0 < row["hetero"]["cpu_p50_us"] <= row["hetero"]["cpu_p99_us"]
        assert row["speedup_p99"] == pytest.approx(
            row["naive"]["p99_us"] / row["hetero"]["p99_us"], rel=0.05
        )
    assert set(payload["growth"]) == {
        "hetero_p50_ratio_10000_vs_100",
        "naive_p50_ratio_10000_vs_100",
    }


def test_simulate_prints_policies_side_by_side(tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(
        "name: tiny\nseed: 1\nduration_s: 10\narrivals: {kind: poisson, rate_per_s: 10}\n"
        "mix:\n  - {route: /v1/embeddings, text_tokens: 256}\n"
        "  - {route: /v1/audio/transcriptions, audio_seconds: 30}\n"
    )
    plot = tmp_path / "p.png"
    result = hetero(
        "simulate",
        "policies/sim/mixed-fleet.yaml",
        "--workload",
        str(workload),
        "--policies",
        "hetero,round_robin",
        "--json",
        "--plot",
        str(plot),
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["results"]
    assert [r["policy"] for r in rows] == ["hetero", "round_robin"]
    assert rows[0]["completed"] == rows[1]["completed"] > 50
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_simulate_bad_input_exits_2(tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text("name: x\narrivals: {kind: poisson}\nmix: [{route: /v1/embeddings}]\n")
    bad = hetero("simulate", "policies/sim/mixed-fleet.yaml", "--workload", str(workload))
    assert bad.returncode == 2
    assert f"{workload}:2: arrivals: poisson arrivals need rate_per_s" in bad.stderr
    unknown = hetero(
        "simulate",
        "policies/sim/mixed-fleet.yaml",
        "--workload",
        str(workload),
        "--policies",
        "fifo",
    )
    assert unknown.returncode == 2 and "unknown fifo" in unknown.stderr
