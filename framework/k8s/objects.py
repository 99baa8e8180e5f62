"""Small builders shared by the manifests: names, labels, metadata, hardened security contexts,
paths as the container sees them, and the YAML the manifests are written as."""

from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = [
    "HOME",
    "RUN_AS",
    "Manifest",
    "container_security",
    "dns_name",
    "dump_all",
    "in_container",
    "labels",
    "metadata",
    "pod_security",
    "quantity_mib",
]

Manifest = dict[str, Any]

HOME = "/var/lib/hetero"
"""The container's HOME: ``~`` in the policy's paths is this, on the state volume."""
RUN_AS = 10001
"""The uid and gid hetero runs as in its pods (no root, no name in the image needed)."""
MANAGED_BY = "hetero-deploy-k8s"


def dns_name(text: str) -> str:
    """``text`` as an RFC 1123 label (a policy's ``id_cards`` becomes ``id-cards``)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return name[:63].rstrip("-") or "x"


def labels(release: str, component: str) -> dict[str, str]:
    """The recommended ``app.kubernetes.io`` labels of one of the release's parts."""
    return {
        "app.kubernetes.io/name": "hetero",
        "app.kubernetes.io/instance": release,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def selector(release: str, component: str) -> dict[str, str]:
    """The labels a Service or Deployment selects one part by (stable across versions)."""
    return {
        "app.kubernetes.io/name": "hetero",
        "app.kubernetes.io/instance": release,
        "app.kubernetes.io/component": component,
    }


def metadata(
    name: str, release: str, component: str, namespace: str | None, **extra: str
) -> dict[str, Any]:
    """``metadata`` of an object; ``namespace`` None for cluster-scoped kinds."""
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = {**labels(release, component), **extra}
    return meta


def pod_security() -> dict[str, Any]:
    """The pod-level security context: not root, a fixed uid, the runtime's seccomp profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> dict[str, Any]:
    """The container-level security context (the ``restricted`` Pod Security Standard)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def in_container(path: str) -> str:
    """A policy path as the container sees it: ``~`` is :data:`HOME`."""
    if path == "~":
        return HOME
    if path.startswith("~/"):
        return HOME + path[1:]
    return path


def quantity_mib(size_bytes: int, headroom: float = 1.25) -> str:
    """A volume size for ``size_bytes`` of data plus ``headroom`` (a file system's own use and
    entries written while the oldest are evicted), in whole MiB."""
    return f"{max(1, -(-int(size_bytes * headroom) // 2**20))}Mi"


class _Dumper(yaml.SafeDumper):
    """Block style, keys in the order built, multi-line strings as literal blocks."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _text)


def dump_all(manifests: list[Manifest]) -> str:
    """The manifests as one multi-document YAML text."""
    return yaml.dump_all(
        manifests, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100
    )
