"""Access control for sensitive partitions: roles (RBAC) plus attribute rules (ABAC), deny by
default, every decision explained by the rule that decided it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hetero.framework.policy.schema import PartitionConfig

__all__ = ["AccessDecision", "Principal", "decide"]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who asks: a name, roles, and attributes (department, clearance, purpose, ...)."""

    name: str
    roles: frozenset[str] = frozenset()
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AccessDecision:
    """Allowed or not, and which rule decided."""

    allowed: bool
    rule: str
    reason: str


def decide(principal: Principal, partition_name: str, partition: PartitionConfig) -> AccessDecision:
    """May ``principal`` touch ``partition``? Every rule must pass; the first failure denies."""
    granted = principal.roles & set(partition.roles)
    if not granted:
        return AccessDecision(
            False,
            f"partitions.{partition_name}.roles",
            f"{principal.name} has none of the roles {sorted(partition.roles)}",
        )
    for index, rule in enumerate(partition.attribute_rules):
        value = principal.attributes.get(rule.attribute)
        if value not in rule.one_of:
            shown = "missing" if value is None else repr(value)
            return AccessDecision(
                False,
                f"partitions.{partition_name}.attribute_rules[{index}]",
                f"{principal.name}'s {rule.attribute} is {shown}, not one of {list(rule.one_of)}",
            )
    return AccessDecision(
        True,
        f"partitions.{partition_name}.roles",
        f"{principal.name} holds {sorted(granted)} and meets {len(partition.attribute_rules)} "
        "attribute rule(s)",
    )
