"""``hetero simulate`` gives the same figures whatever PYTHONHASHSEED is (issue 14, item 11):
the policy's maps iterate in hash order, and nothing that breaks a tie may depend on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def simulate(seed: str, workload: Path, policy: str = "mixed-fleet") -> dict[str, Any]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hetero.framework.cli",
            "simulate",
            str(REPO / "policies" / "sim" / f"{policy}.yaml"),
            "--workload",
            str(workload),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "PYTHONHASHSEED": seed},
    )
    assert result.returncode == 0, result.stderr
    figures: dict[str, Any] = json.loads(result.stdout)
    for entry in figures["results"]:
        entry.pop("wall_s")  # how long the run took on this machine: the one honest difference
        entry.pop("cpu_s")  # and the CPU time it took
    return figures


def test_the_mixed_fleet_gives_identical_json_under_every_hash_seed(tmp_path: Path) -> None:
    shipped = (REPO / "benchmarks" / "scenarios" / "mixed-fleet" / "workload.yaml").read_text()
    assert "duration_s: 180" in shipped and "warmup_s: 30" in shipped
    workload = tmp_path / "mixed-fleet-short.yaml"  # the same fleet and mix, 8 s of arrivals
    workload.write_text(
        shipped.replace("duration_s: 180", "duration_s: 8").replace("warmup_s: 30", "warmup_s: 3")
    )
    runs = {seed: simulate(seed, workload) for seed in ("0", "1", "2")}
    assert runs["0"]["results"][0]["completed"] > 500  # it did run the fleet (decode modelled)
    assert runs["0"] == runs["1"] == runs["2"]


def test_continuous_llm_batching_gives_identical_json_under_every_hash_seed(
    tmp_path: Path,
) -> None:
    shipped = (REPO / "benchmarks" / "scenarios" / "ref-8xa100" / "workload.yaml").read_text()
    assert "duration_s: 180" in shipped and "warmup_s: 30" in shipped
    workload = tmp_path / "ref-8xa100-short.yaml"  # the DGX A100 and its mix, 15 s of clients
    workload.write_text(
        shipped.replace("duration_s: 180", "duration_s: 15").replace("warmup_s: 30", "warmup_s: 5")
    )
    runs = {seed: simulate(seed, workload, "8xa100") for seed in ("0", "1")}
    assert runs["0"]["results"][0]["completed"] > 500  # it did run the LLM
    assert runs["0"] == runs["1"]
