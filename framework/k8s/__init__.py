"""Kubernetes delivery: a policy rendered as plain manifests (``hetero deploy k8s``).

One node: a Deployment and Service for ``hetero serve``; a cluster: a KubeRay RayCluster whose
head runs the front door. Around them: the policy as a ConfigMap, volumes for the state, the
disk tier and each partition, keys from Secrets, RuntimeClasses and sandbox pods for sensitive
partitions with a default-deny NetworkPolicy, a ServiceMonitor, accelerator requests, and the
policy's locality as node affinity and topology spread.
"""

from hetero.framework.k8s.options import ACCELERATORS, DeployError, KubeOptions, parse_accelerator
from hetero.framework.k8s.render import HEADER, Rendered, render, write_manifests

__all__ = [
    "ACCELERATORS",
    "HEADER",
    "DeployError",
    "KubeOptions",
    "Rendered",
    "parse_accelerator",
    "render",
    "write_manifests",
]
