"""The ``hetero serve`` container and the volumes it mounts: the policy (a ConfigMap), the
state volume (audit log, sandbox state, HOME), the feature cache's disk tier, one volume per
partition, and the keys, each from a Secret (never in the manifests)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from hetero.framework.k8s.objects import (
    HOME,
    Manifest,
    container_security,
    dns_name,
    in_container,
    metadata,
    quantity_mib,
)
from hetero.framework.k8s.options import KubeOptions
from hetero.framework.policy import Policy

__all__ = [
    "MODEL_CACHE",
    "POLICY_PATH",
    "SecretRef",
    "ServerPod",
    "partition_claim",
    "server_pod",
]

POLICY_DIR = "/etc/hetero/policy"
POLICY_PATH = f"{POLICY_DIR}/policy.yaml"
MODEL_CACHE = "/var/cache/hetero/models"
DEFAULT_PORT = 8000
# How long `hetero serve` may take to load its models before the kubelet restarts it (the
# systemd unit's TimeoutStartSec): startup probe period x failures.
STARTUP_PERIOD_S = 10
STARTUP_FAILURES = 60


@dataclass(frozen=True, slots=True)
class SecretRef:
    """A Secret the pod reads (the operator creates it: ``kubectl create secret generic``).

    Attributes:
        name: The Secret's name.
        key: The key in it.
        why: What it holds, for the docs and the rendered comment.
        path: Where its file is mounted (None: it is an environment variable).
        env: The environment variable it sets (None: it is a file).
    """

    name: str
    key: str
    why: str
    path: str | None = None
    env: str | None = None


@dataclass(slots=True)
class ServerPod:
    """What the server's pod needs: its container, volumes, claims and secrets."""

    container: dict[str, Any]
    volumes: list[dict[str, Any]]
    claims: list[Manifest]
    secrets: list[SecretRef] = field(default_factory=list)


def _claim(name: str, options: KubeOptions, component: str, size: str, cls: str | None) -> Manifest:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
    }
    if cls is not None:
        spec["storageClassName"] = cls
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(name, options.name, component, options.namespace),
        "spec": spec,
    }


def partition_claim(options: KubeOptions, partition: str) -> str:
    """The name of a partition's PersistentVolumeClaim."""
    return f"{options.name}-partition-{dns_name(partition)}"


def _secrets(policy: Policy, options: KubeOptions) -> list[SecretRef]:
    spec = policy.spec
    keys = [p.key for p in spec.partitions.values()]
    found: list[SecretRef] = []
    if any(key.startswith("file:") for key in keys):
        found.append(
            SecretRef(
                f"{options.name}-keyring",
                "keyring.json",
                "the partitions' key-encryption keys (sandbox.keyring)",
                path=in_container(spec.sandbox.keyring),
            )
        )
    if any(key.startswith("pkcs11:") for key in keys):
        found.append(
            SecretRef(
                f"{options.name}-pkcs11",
                "pin",
                "the HSM user PIN (sandbox.pkcs11_pin_env)",
                env=spec.sandbox.pkcs11_pin_env,
            )
        )
    if spec.partitions:
        found.append(
            SecretRef(
                f"{options.name}-audit-signing",
                "audit-signing.pem",
                "the audit log's Ed25519 signing key (audit.signing_key)",
                path=in_container(spec.audit.signing_key),
            )
        )
    if spec.server.api_keys_file:
        found.append(
            SecretRef(
                f"{options.name}-api-keys",
                "api-keys.yaml",
                "the API keys' hashes (server.api_keys_file)",
                path=in_container(spec.server.api_keys_file),
            )
        )
    return found


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def server_pod(policy: Policy, options: KubeOptions, component: str) -> ServerPod:
    """The ``hetero serve`` container of the release, with its volumes and claims."""
    spec = policy.spec
    mounts: list[dict[str, Any]] = [
        {"name": "policy", "mountPath": POLICY_DIR, "readOnly": True},
        {"name": "state", "mountPath": HOME},
        {"name": "models", "mountPath": MODEL_CACHE},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "policy", "configMap": {"name": f"{options.name}-policy"}},
        {"name": "state", "persistentVolumeClaim": {"claimName": f"{options.name}-state"}},
        {"name": "models", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    claims = [_claim(f"{options.name}-state", options, component, "1Gi", options.storage_class)]
    # Directories hetero writes outside HOME live on the state volume too (a sub-path each).
    written = [posixpath.dirname(in_container(spec.audit.path))]
    if spec.partitions:
        written += [in_container(spec.sandbox.state_dir), in_container(spec.sandbox.partitions_dir)]
    for directory in dict.fromkeys(written):
        if not _under(directory, HOME):
            mounts.append(
                {"name": "state", "mountPath": directory, "subPath": directory.strip("/")}
            )
    cache = spec.cache
    if cache.enabled and cache.disk.enabled:
        claims.append(
            _claim(
                f"{options.name}-features",
                options,
                component,
                quantity_mib(cache.disk.max_bytes),
                options.storage_class,
            )
        )
        volumes.append(
            {"name": "features", "persistentVolumeClaim": {"claimName": f"{options.name}-features"}}
        )
        mounts.append({"name": "features", "mountPath": in_container(cache.disk.path)})
    partitions_dir = in_container(spec.sandbox.partitions_dir)
    for partition in sorted(spec.partitions):
        claim = partition_claim(options, partition)
        claims.append(
            _claim(
                claim,
                options,
                "partition",
                options.partition_size,
                options.partition_storage_class,
            )
        )
        volume = f"partition-{dns_name(partition)}"
        volumes.append({"name": volume, "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": volume, "mountPath": posixpath.join(partitions_dir, partition)})
    secrets = _secrets(policy, options)
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": HOME},
        {"name": "HETERO_MODEL_CACHE", "value": MODEL_CACHE},
    ]
    for secret in secrets:
        if secret.env is not None:
            env.append(
                {
                    "name": secret.env,
                    "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}},
                }
            )
            continue
        assert secret.path is not None
        volume = f"secret-{dns_name(secret.key)}"
        volumes.append(
            {"name": volume, "secret": {"secretName": secret.name, "defaultMode": 0o440}}
        )
        mounts.append(
            {"name": volume, "mountPath": secret.path, "subPath": secret.key, "readOnly": True}
        )
    port = spec.server.port or DEFAULT_PORT
    resources: dict[str, Any] = {
        "requests": {"cpu": "2", "memory": "4Gi"},
        "limits": {"memory": "8Gi"},
    }
    for accelerator, count in options.accelerators:
        # Extended resources: the request must equal the limit.
        resources["requests"][accelerator.resource] = count
        resources["limits"][accelerator.resource] = count
    container = {
        "name": "hetero",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["serve", "--policy", POLICY_PATH, "--host", "0.0.0.0", "--port", str(port)],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "env": env,
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": container_security(),
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": STARTUP_PERIOD_S,
            "failureThreshold": STARTUP_FAILURES,
        },
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
    }
    return ServerPod(container, volumes, claims, secrets)
