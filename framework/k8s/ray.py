"""The Ray execution mode on KubeRay: a RayCluster (``ray.io/v1``) whose head pod also runs
``hetero serve`` (the front door, a Ray driver on the head node, beside ``ray start --head``)
and one worker group per accelerator kind, each worker lending the devices it was given."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, requires
from typing import Any

from hetero.framework.k8s.objects import (
    Manifest,
    container_security,
    metadata,
    pod_security,
)
from hetero.framework.k8s.options import DeployError, KubeOptions
from hetero.framework.k8s.placement import Placement, spread
from hetero.framework.k8s.server_pod import ServerPod

__all__ = ["GCS_PORT", "ray_cluster", "ray_version"]

GCS_PORT = 6379
CLIENT_PORT = 10001
# Ray's session directory and object store, shared by the head's two containers: the driver
# (hetero serve) reaches the head's raylet through sockets under /tmp/ray and maps the object
# store from /dev/shm.
RAY_TMP = "/tmp/ray"
SHM = "/dev/shm"


def ray_version() -> str:
    """The Ray release hetero's ``ray`` extra pins (pyproject.toml is the one source)."""
    try:
        wanted = requires("hetero") or []
    except PackageNotFoundError as err:
        raise DeployError("hetero's package metadata is missing: reinstall hetero") from err
    for requirement in wanted:
        name, sep, rest = requirement.partition("==")
        if sep and name.strip() == "ray":
            return rest.split(";", 1)[0].strip()
    raise DeployError("hetero's ray extra pins no ray release (pyproject.toml)")


def _health_probe(address: str) -> dict[str, Any]:
    # Ray core has no dashboard, so not KubeRay's default probes (which ask the dashboard
    # agent); `ray health-check` asks the GCS.
    return {
        "exec": {"command": ["ray", "health-check", "--address", address]},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 6,
    }


def _ray_container(name: str, options: KubeOptions, address: str) -> dict[str, Any]:
    security = container_security()
    security["readOnlyRootFilesystem"] = False  # ray start writes its session files widely
    return {
        "name": name,
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "env": [
            {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
            {"name": "HOME", "value": "/tmp"},
        ],
        "securityContext": security,
        "volumeMounts": [
            {"name": "ray-tmp", "mountPath": RAY_TMP},
            {"name": "shm", "mountPath": SHM},
        ],
        "readinessProbe": _health_probe(address),
        "livenessProbe": _health_probe(address),
    }


def ray_cluster(
    options: KubeOptions,
    server: ServerPod,
    head_labels: dict[str, str],
    placement: Placement,
    service_account: str,
) -> Manifest:
    """The RayCluster: the head (``ray start --head`` and the front door) and the workers."""
    version = ray_version()
    head = _ray_container("ray-head", options, f"127.0.0.1:{GCS_PORT}")
    head["ports"] = [
        {"name": "gcs", "containerPort": GCS_PORT},
        {"name": "client", "containerPort": CLIENT_PORT},
    ]
    head["resources"] = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
    front = dict(server.container)
    front["env"] = [
        *front["env"],
        # the policy's cluster.address "auto" finds the cluster through RAY_ADDRESS
        {"name": "RAY_ADDRESS", "value": f"127.0.0.1:{GCS_PORT}"},
        {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
    ]
    front["volumeMounts"] = [
        *front["volumeMounts"],
        {"name": "ray-tmp", "mountPath": RAY_TMP},
        {"name": "shm", "mountPath": SHM},
    ]
    # the front door runs no model: the workers' accelerators are theirs
    front["resources"] = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}
    ray_volumes = [
        {"name": "ray-tmp", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    affinity = placement.affinity()
    head_pod: dict[str, Any] = {
        "serviceAccountName": service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security(),
        "containers": [head, front],
        "volumes": [*server.volumes, *ray_volumes],
    }
    if affinity is not None:
        head_pod["affinity"] = affinity
    head_address = f"{options.name}-head-svc.{options.namespace}.svc:{GCS_PORT}"
    groups = [(a.kind, {a.resource: n}) for a, n in options.accelerators] or [("cpu", {})]
    workers: list[dict[str, Any]] = []
    for group, extended in groups:
        worker = _ray_container("ray-worker", options, head_address)
        worker["resources"] = {
            "requests": {"cpu": "4", "memory": "16Gi", **extended},
            "limits": {"memory": "16Gi", **extended},
        }
        worker_labels = {
            "app.kubernetes.io/name": "hetero",
            "app.kubernetes.io/instance": options.name,
            "app.kubernetes.io/component": f"ray-worker-{group}",
        }
        pod: dict[str, Any] = {
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": pod_security(),
            "containers": [worker],
            "volumes": ray_volumes,
            "topologySpreadConstraints": spread(worker_labels),
            "tolerations": [
                {"key": resource, "operator": "Exists", "effect": "NoSchedule"}
                for resource in extended
            ],
        }
        if affinity is not None:
            pod["affinity"] = affinity
        workers.append(
            {
                "groupName": group,
                "replicas": options.workers,
                "minReplicas": options.workers,
                "maxReplicas": options.workers,
                "rayStartParams": {},
                "template": {"metadata": {"labels": worker_labels}, "spec": pod},
            }
        )
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": metadata(options.name, options.name, "ray", options.namespace),
        "spec": {
            "rayVersion": version,
            "headGroupSpec": {
                "rayStartParams": {"port": str(GCS_PORT), "include-dashboard": "false"},
                "template": {"metadata": {"labels": dict(head_labels)}, "spec": head_pod},
            },
            "workerGroupSpecs": workers,
        },
    }
