"""The policy's data-locality constraints as Kubernetes scheduling: node affinity for the
sites, zones and hosts stages must (or should) run in, topology spread for Ray workers, and
pod affinity that keeps a sandbox on the node holding its partition's volume."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetero.framework.policy import Policy
from hetero.framework.policy.yaml_source import LocatedYaml

__all__ = [
    "LOCALITY_LABELS",
    "Placement",
    "co_located",
    "placement_of",
    "spread",
]

# The well-known node labels each locality key maps to. numa_node has none: inside a node the
# kubelet's Topology Manager places, and the policy's NUMA constraint stays the scheduler's.
LOCALITY_LABELS = {
    "site": "topology.kubernetes.io/region",
    "zone": "topology.kubernetes.io/zone",
    "host": "kubernetes.io/hostname",
}


@dataclass(frozen=True, slots=True)
class Placement:
    """Node labels the pods running stages need (``required``) or should get (``preferred``),
    and the stages whose NUMA constraint is left to the node."""

    required: dict[str, str]
    preferred: dict[str, str]
    numa_stages: tuple[str, ...]

    def affinity(self) -> dict[str, Any] | None:
        """The pod's ``affinity`` (None when the policy constrains nothing)."""
        node: dict[str, Any] = {}
        if self.required:
            node["requiredDuringSchedulingIgnoredDuringExecution"] = {
                "nodeSelectorTerms": [{"matchExpressions": _expressions(self.required)}]
            }
        if self.preferred:
            node["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {"weight": 50, "preference": {"matchExpressions": _expressions(self.preferred)}}
            ]
        return {"nodeAffinity": node} if node else None


def _expressions(wanted: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {"key": label, "operator": "In", "values": [value]}
        for label, value in sorted(wanted.items())
    ]


def placement_of(policy: Policy, located: LocatedYaml) -> Placement:
    """Where the pods that run the policy's stages must go: each ``require``d key as a
    required node label, each ``prefer``red one as a preference. Every stage runs in the same
    pods (the Deployment, or any Ray worker), so two stages requiring different values of one
    key cannot both be met: a PolicyValidationError names the second one's line."""
    required: dict[str, tuple[str, str]] = {}
    preferred: dict[str, str] = {}
    numa: list[str] = []
    # in the file's order, so a conflict is reported at the later of the two stages
    stages = sorted(
        policy.spec.stages.items(), key=lambda item: located.line_of(("stages", item[0])) or 0
    )
    for stage_name, stage in stages:
        locality = stage.locality
        if locality is None:
            continue
        if locality.numa_node is not None:
            numa.append(stage_name)
        for key, label in LOCALITY_LABELS.items():
            value = getattr(locality, key)
            if value is None:
                continue
            if locality.mode == "prefer":
                preferred.setdefault(label, str(value))
                continue
            held = required.setdefault(label, (str(value), stage_name))
            if held[0] != str(value):
                raise located.error(
                    ("stages", stage_name, "locality", key),
                    f"requires {key} {value}, but stage {held[1]} requires {key} {held[0]}: "
                    "every stage runs in the same pods, which cannot be in both",
                )
    return Placement(
        {label: value for label, (value, _) in required.items()},
        {label: v for label, v in preferred.items() if label not in required},
        tuple(numa),
    )


def spread(pod_labels: dict[str, str]) -> list[dict[str, Any]]:
    """Topology spread of a group's pods: over zones, then over nodes (best effort: a
    smaller cluster still schedules them)."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": dict(pod_labels)},
        }
        for key in ("topology.kubernetes.io/zone", "kubernetes.io/hostname")
    ]


def co_located(holder_labels: dict[str, str]) -> dict[str, Any]:
    """Pod affinity to the node running the pod with ``holder_labels`` (the one that holds
    the volume the pod reads: a ReadWriteOnce volume is mounted on one node only)."""
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": dict(holder_labels)},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
