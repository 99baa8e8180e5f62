"""A policy with ``cluster.engine: ray`` gets its fleet and backend from the cluster engine the
registry holds (hetero's ``hetero.plugins: ray`` entry point registers it), so the fleet, below
the engine, never imports the cluster package, above it. Ray itself is not in this venv: the
cluster here is a stand-in (``make test-ray`` runs the real one)."""

from __future__ import annotations

import importlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import hetero.framework.cluster as cluster_package
from hetero.framework.errors import BackendUnavailableError
from hetero.framework.fleet import CLUSTER_ENGINE, backend_for, resolve_fleet, simulated_devices
from hetero.framework.policy import load_policy_text
from hetero.framework.policy.schema import ClusterConfig
from hetero.framework.registry import Registry

REPO = Path(__file__).resolve().parents[2]

RAY = """\
version: 1
cluster: {engine: ray, address: "ray://head:10001"}
devices:
  deny: ["sim:big-1"]
stages:
  enc:
    modality: image
    device_classes: [cuda]
    variants:
      full: {flops_per_item: 1 TFLOPS, bytes_per_item: 1 GB, resident_bytes: 2 GB}
qos:
  default_class: s
  classes: {s: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 100}}
"""

GROUP = """\
version: 1
devices:
  simulated:
    - {name: big, class: cuda, vendor_name: Big, count: 2, memory: 80 GB,
       memory_bandwidth: 1000 GB/s, peak_flops: {fp32: 10 TFLOPS}}
stages:
  enc:
    modality: image
    device_classes: [cuda]
    variants:
      full: {flops_per_item: 1 TFLOPS, bytes_per_item: 1 GB, resident_bytes: 2 GB}
qos:
  default_class: s
  classes: {s: {weight: 1, sla_tier: t}}
sla_tiers: {t: {deadline_ms: 100}}
"""


@dataclass
class StandInCluster:
    """A stand-in for a Ray cluster's connection: its nodes' devices and the backend over them."""

    devices: tuple[Any, ...]
    backend: object


def test_a_ray_policy_runs_on_the_registered_cluster_engines_devices_and_backend() -> None:
    devices = tuple(simulated_devices(load_policy_text(GROUP, "g").spec.devices.simulated))
    stand_in = StandInCluster(devices, backend=object())
    asked: list[ClusterConfig] = []

    def connect(config: ClusterConfig) -> StandInCluster:
        asked.append(config)
        return stand_in

    registry = Registry(use_entry_points=False)
    registry.register(CLUSTER_ENGINE, "ray", connect)
    policy = load_policy_text(RAY, "ray.yaml")
    fleet = resolve_fleet(policy, registry)
    assert [d.id for d in fleet.devices] == ["sim:big-0"]  # the policy's deny rule still applies
    assert backend_for("ray", policy, registry) is stand_in.backend
    assert [c.address for c in asked] == ["ray://head:10001"] * 2


def test_without_a_cluster_engine_a_ray_policy_is_refused_with_the_remedy() -> None:
    with pytest.raises(BackendUnavailableError, match="no cluster engine 'ray' is registered"):
        resolve_fleet(load_policy_text(RAY, "ray.yaml"), Registry(use_entry_points=False))


def test_the_entry_point_registers_the_clusters_connect() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["hetero.plugins"]["ray"]
    module, _, name = target.partition(":")
    registry = Registry(use_entry_points=False)
    getattr(importlib.import_module(module), name)(registry)
    assert registry.extensions(CLUSTER_ENGINE) == {"ray": cluster_package.connect}
