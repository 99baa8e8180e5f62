"""Sensitive partitions on Kubernetes: a RuntimeClass per isolation level the partitions ask
for (``vm``: Kata Containers, ``container``: gVisor), one sandbox worker pod per sensitive
stage in that RuntimeClass, reading only its partition's volume on the node that holds it, and
a default-deny NetworkPolicy around every sandbox pod (no traffic in or out)."""

from __future__ import annotations

from typing import Any

from hetero.framework.k8s.objects import (
    Manifest,
    container_security,
    dns_name,
    metadata,
    pod_security,
    selector,
)
from hetero.framework.k8s.options import KubeOptions
from hetero.framework.k8s.placement import co_located
from hetero.framework.k8s.server_pod import MODEL_CACHE, partition_claim
from hetero.framework.policy import Policy

__all__ = [
    "RUNTIME_CLASSES",
    "SANDBOX_LABEL",
    "runtime_classes",
    "sandbox_deny_policy",
    "sandbox_deployments",
]

SANDBOX_LABEL = "hetero.dev/sandbox"
"""Every sandbox pod carries it (its value: the partition); the NetworkPolicy selects on it."""

# isolation -> (RuntimeClass name, the CRI handler containerd / CRI-O knows it by, the node
# label that says a node has the runtime, the pod overhead the runtime adds). Kata's label and
# figures are kata-deploy's (it labels the nodes it installs on); gVisor's installers set no
# label, so the operator labels its nodes ``hetero.dev/gvisor=true`` (docs/cluster.md).
RUNTIME_CLASSES: dict[str, tuple[str, str, str, dict[str, str]]] = {
    "vm": ("kata", "kata", "katacontainers.io/kata-runtime", {"memory": "160Mi", "cpu": "250m"}),
    "container": ("gvisor", "runsc", "hetero.dev/gvisor", {"memory": "32Mi", "cpu": "50m"}),
}


def runtime_classes(policy: Policy, options: KubeOptions) -> list[Manifest]:
    """The RuntimeClasses the policy's partitions need (cluster-scoped; none for ``process``,
    which runs in the default runtime)."""
    wanted = sorted({p.isolation for p in policy.spec.partitions.values()} & set(RUNTIME_CLASSES))
    classes: list[Manifest] = []
    for isolation in wanted:
        name, handler, node_label, overhead = RUNTIME_CLASSES[isolation]
        classes.append(
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": metadata(name, options.name, "sandbox-runtime", None),
                "handler": handler,
                "overhead": {"podFixed": dict(overhead)},
                "scheduling": {"nodeSelector": {node_label: "true"}},
            }
        )
    return classes


def sandbox_deployments(
    policy: Policy, options: KubeOptions, kinds: dict[str, str], server_labels: dict[str, str]
) -> list[Manifest]:
    """One worker Deployment per sensitive stage, in its partition's RuntimeClass, with that
    partition's volume read-only at ``/data``, on the node of the server pod (which holds the
    volume), no service-account token, no service links. ``kinds`` maps a stage to the stage
    plugin kind its worker runs (``stage:<kind>``)."""
    spec = policy.spec
    config = spec.sandbox
    deployments: list[Manifest] = []
    for stage_name, stage in sorted(spec.stages.items()):
        if stage.partition is None:
            continue
        partition = spec.partitions[stage.partition]
        name = f"{options.name}-sandbox-{dns_name(stage_name)}"
        pod_labels = {**selector(options.name, "sandbox"), SANDBOX_LABEL: dns_name(stage.partition)}
        pod: dict[str, Any] = {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": pod_security(),
            "affinity": co_located(server_labels),
            "containers": [
                {
                    "name": "worker",
                    "image": options.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-m", "hetero.sandbox.worker"],
                    "args": [
                        "--partition",
                        stage.partition,
                        "--handler",
                        f"stage:{kinds.get(stage_name, stage_name)}",
                        "--data",
                        "/data",
                        "--socket",
                        "/run/hetero/worker.sock",
                    ],
                    "env": [{"name": "HETERO_MODEL_CACHE", "value": MODEL_CACHE}],
                    "resources": {
                        "requests": {
                            "cpu": str(config.worker_cpus),
                            "memory": str(config.worker_memory),
                        },
                        "limits": {
                            "cpu": str(config.worker_cpus),
                            "memory": str(config.worker_memory),
                        },
                    },
                    "securityContext": container_security(),
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data", "readOnly": True},
                        {"name": "socket", "mountPath": "/run/hetero"},
                        {"name": "models", "mountPath": MODEL_CACHE},
                        {"name": "tmp", "mountPath": "/tmp"},
                    ],
                }
            ],
            "volumes": [
                {
                    "name": "data",
                    "persistentVolumeClaim": {
                        "claimName": partition_claim(options, stage.partition),
                        "readOnly": True,
                    },
                },
                {"name": "socket", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                {"name": "models", "emptyDir": {}},
                {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            ],
        }
        if partition.isolation in RUNTIME_CLASSES:
            pod["runtimeClassName"] = RUNTIME_CLASSES[partition.isolation][0]
        deployments.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": metadata(
                    name,
                    options.name,
                    "sandbox",
                    options.namespace,
                    **{SANDBOX_LABEL: dns_name(stage.partition)},
                ),
                "spec": {
                    "replicas": 1,
                    "strategy": {"type": "Recreate"},
                    "selector": {"matchLabels": pod_labels},
                    "template": {"metadata": {"labels": pod_labels}, "spec": pod},
                },
            }
        )
    return deployments


def sandbox_deny_policy(options: KubeOptions) -> Manifest:
    """Default deny around the sandboxes: every pod labelled :data:`SANDBOX_LABEL` may neither
    receive nor send any traffic (both policy types, no rules)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(
            f"{options.name}-sandbox-deny-all", options.name, "sandbox", options.namespace
        ),
        "spec": {
            "podSelector": {
                "matchExpressions": [{"key": SANDBOX_LABEL, "operator": "Exists"}],
            },
            "policyTypes": ["Ingress", "Egress"],
        },
    }
