"""A policy as Kubernetes manifests (``hetero deploy k8s``), and writing them to a folder.

Plain YAML, one object per file, numbered in the order ``kubectl apply -f DIR`` should create
them (it applies a folder's files in name order): what an air-gapped site can review line by
line and apply with nothing but kubectl. See docs/cluster.md, "Kubernetes".
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero.framework.k8s.objects import (
    Manifest,
    dump_all,
    metadata,
    pod_security,
    selector,
)
from hetero.framework.k8s.options import DeployError, KubeOptions
from hetero.framework.k8s.placement import Placement, placement_of
from hetero.framework.k8s.ray import ray_cluster
from hetero.framework.k8s.sandboxes import (
    runtime_classes,
    sandbox_deny_policy,
    sandbox_deployments,
)
from hetero.framework.k8s.server_pod import SecretRef, server_pod
from hetero.framework.policy import Policy
from hetero.framework.policy.yaml_source import LocatedYaml, load_located

__all__ = ["HEADER", "Rendered", "render", "write_manifests"]

HEADER = "# Rendered by `hetero deploy k8s`"
"""The first line of every file written: a re-render replaces only files that start with it."""


@dataclass(frozen=True, slots=True)
class Rendered:
    """The manifests of one policy, in apply order, and the Secrets they read (created by the
    operator, named here so the docs and the command can say which)."""

    manifests: tuple[Manifest, ...]
    secrets: tuple[SecretRef, ...]
    engine: str
    placement: Placement


def _check_accelerators(policy: Policy, options: KubeOptions, located: LocatedYaml) -> None:
    """Each accelerator asked for is of a device class the policy's devices rules let in (a
    class-only check: the patterns may also name backends and device ids)."""
    devices = policy.spec.devices
    for accelerator, _ in options.accelerators:
        cls = accelerator.device_class
        denied = any(fnmatch.fnmatchcase(cls, pattern) for pattern in devices.deny)
        allowed = any(fnmatch.fnmatchcase(cls, pattern) for pattern in devices.allow)
        if denied or not allowed:
            raise located.error(
                ("devices", "deny") if denied else ("devices", "allow"),
                f"the policy does not use {cls} devices, so the {accelerator.resource} the "
                f"pods would hold for --accelerator {accelerator.kind} would stay idle",
            )


def _check_isolation(policy: Policy, located: LocatedYaml) -> None:
    """Every partition's isolation has a RuntimeClass here: ``tee`` (a confidential VM whose
    evidence releases the keys) has none yet, and rendering it as anything weaker would give a
    partition less than its policy asks."""
    for name, partition in policy.spec.partitions.items():
        if partition.isolation == "tee":
            raise located.error(
                ("partitions", name, "isolation"),
                f"partition {name!r} asks for isolation: tee, which these manifests cannot "
                "give (no confidential-VM RuntimeClass is rendered yet): serve it on a host "
                "with a TEE, or choose vm (Kata) for Kubernetes",
            )


def render(
    policy: Policy, policy_text: str, options: KubeOptions, kinds: Mapping[str, str]
) -> Rendered:
    """The manifests for ``policy`` (whose file's text is ``policy_text``, served verbatim
    from a ConfigMap). ``kinds`` maps each sensitive stage to its stage plugin's kind.

    Raises:
        PolicyValidationError: the policy asks for what the manifests cannot express (file
            and line named).
        DeployError: the options contradict the policy.
    """
    located = load_located(policy_text, policy.source)
    engine = options.engine or policy.spec.cluster.engine
    if engine == "ray" and policy.spec.cluster.engine != "ray":
        raise located.error(
            ("cluster",),
            "the manifests for a Ray cluster serve this policy, which runs the embedded "
            "engine: set cluster: {engine: ray} in it (the address stays auto)",
        )
    _check_accelerators(policy, options, located)
    _check_isolation(policy, located)
    placement = placement_of(policy, located)
    name, ns = options.name, options.namespace
    component = "ray-head" if engine == "ray" else "server"
    server_labels = selector(name, component)
    server = server_pod(policy, options, component)
    manifests: list[Manifest] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": metadata(
                ns,
                name,
                "namespace",
                None,
                **_pod_security_labels(engine),
            ),
        },
        *runtime_classes(policy, options),
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": metadata(name, name, "server", ns),
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(f"{name}-policy", name, "server", ns),
            "data": {"policy.yaml": policy_text},
        },
        *server.claims,
    ]
    if policy.spec.partitions:
        manifests.append(sandbox_deny_policy(options))
    service_port = server.container["ports"][0]["containerPort"]
    manifests.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(name, name, "server", ns),
            "spec": {
                "type": "ClusterIP",
                "selector": dict(server_labels),
                "ports": [
                    {"name": "http", "port": service_port, "targetPort": "http", "protocol": "TCP"}
                ],
            },
        }
    )
    if engine == "ray":
        manifests.append(ray_cluster(options, server, server_labels, placement, name))
    else:
        manifests.append(_deployment(options, server, server_labels, placement))
    manifests.extend(sandbox_deployments(policy, options, dict(kinds), server_labels))
    manifests.append(_service_monitor(options))
    return Rendered(tuple(manifests), tuple(server.secrets), engine, placement)


def _pod_security_labels(engine: str) -> dict[str, str]:
    # Every pod rendered here meets the restricted Pod Security Standard; KubeRay adds an init
    # container of its own to Ray pods, so the Ray mode enforces baseline and warns on
    # restricted.
    enforce = "baseline" if engine == "ray" else "restricted"
    return {
        "pod-security.kubernetes.io/enforce": enforce,
        "pod-security.kubernetes.io/warn": "restricted",
    }


def _deployment(
    options: KubeOptions, server: Any, pod_labels: dict[str, str], placement: Placement
) -> Manifest:
    pod: dict[str, Any] = {
        "serviceAccountName": options.name,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security(),
        "terminationGracePeriodSeconds": 30,
        "containers": [server.container],
        "volumes": server.volumes,
    }
    affinity = placement.affinity()
    if affinity is not None:
        pod["affinity"] = affinity
    extended = [r for r in server.container["resources"]["limits"] if "/" in r]
    if extended:
        # GPU and NPU nodes are commonly tainted with their resource's name
        pod["tolerations"] = [
            {"key": resource, "operator": "Exists", "effect": "NoSchedule"} for resource in extended
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(options.name, options.name, "server", options.namespace),
        "spec": {
            # One pod: the state, disk-tier and partition volumes are ReadWriteOnce, and the
            # old pod must let go of them before the new one starts.
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": dict(pod_labels)},
            "template": {"metadata": {"labels": dict(pod_labels)}, "spec": pod},
        },
    }


def _service_monitor(options: KubeOptions) -> Manifest:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(options.name, options.name, "server", options.namespace),
        "spec": {
            "selector": {"matchLabels": selector(options.name, "server")},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "30s"}],
        },
    }


def _file_name(index: int, manifest: Manifest) -> str:
    return f"{index:02d}-{manifest['kind'].lower()}-{manifest['metadata']['name']}.yaml"


def write_manifests(rendered: Rendered, out: Path) -> list[Path]:
    """Write one file per manifest into ``out`` (created if missing); files an earlier render
    wrote there are replaced, and a folder holding other YAML files is refused (DeployError)
    rather than mixed with them."""
    if out.exists() and not out.is_dir():
        raise DeployError(f"--out {out}: not a directory")
    out.mkdir(parents=True, exist_ok=True)
    ours: list[Path] = []
    for existing in sorted(out.glob("*.y*ml")):
        with existing.open(encoding="utf-8", errors="replace") as handle:
            if not handle.readline().startswith(HEADER):
                raise DeployError(
                    f"--out {out}: holds {existing.name}, which hetero did not render; "
                    "choose an empty folder (kubectl apply -f would apply it too)"
                )
        ours.append(existing)
    for stale in ours:
        stale.unlink()
    written: list[Path] = []
    for index, manifest in enumerate(rendered.manifests):
        path = out / _file_name(index, manifest)
        path.write_text(f"{HEADER}: edit the policy and render again.\n" + dump_all([manifest]))
        written.append(path)
    return written
