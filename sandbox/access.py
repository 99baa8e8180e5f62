"""Access control for sensitive partitions: roles (RBAC) plus attribute rules (ABAC), deny by
default, every decision explained by the rule that decided it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hetero.framework.policy.schema import (
    CLASSIFICATIONS,
    AccessHours,
    AttributeRule,
    PartitionConfig,
)

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


_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def _rule_passes(rule: AttributeRule, value: str | None) -> bool:
    if rule.one_of is not None:
        return value in rule.one_of
    if value not in CLASSIFICATIONS or rule.at_least is None:
        return False
    return CLASSIFICATIONS.index(value) >= CLASSIFICATIONS.index(rule.at_least)


def _within(hours: AccessHours, now: datetime) -> bool:
    local = now.astimezone(UTC) + timedelta(hours=hours.utc_offset_hours)
    return (
        _WEEKDAYS[local.weekday()] in hours.days
        and hours.start <= local.strftime("%H:%M") <= hours.end
    )


def decide(
    principal: Principal,
    partition_name: str,
    partition: PartitionConfig,
    now: datetime | None = None,
) -> AccessDecision:
    """May ``principal`` touch ``partition`` at ``now`` (default: the current time)? Roles,
    then attribute rules, the purpose and the access hours must all pass; the first failure
    denies, and the decision names the policy rule that decided."""
    granted = principal.roles & set(partition.roles)
    if not granted:
        return AccessDecision(
            False,
            f"partitions.{partition_name}.roles",
            f"{principal.name} has none of the roles {sorted(partition.roles)}",
        )
    for index, rule in enumerate(partition.attribute_rules):
        value = principal.attributes.get(rule.attribute)
        if not _rule_passes(rule, value):
            shown = "missing" if value is None else repr(value)
            wanted = (
                f"one of {list(rule.one_of)}"
                if rule.one_of is not None
                else f"at least {rule.at_least!r}"
            )
            return AccessDecision(
                False,
                f"partitions.{partition_name}.attribute_rules[{index}]",
                f"{principal.name}'s {rule.attribute} is {shown}, not {wanted}",
            )
    if partition.purposes and principal.attributes.get("purpose") not in partition.purposes:
        shown = principal.attributes.get("purpose", "missing")
        return AccessDecision(
            False,
            f"partitions.{partition_name}.purposes",
            f"{principal.name}'s purpose is {shown}, not one of {list(partition.purposes)}",
        )
    hours = partition.access_hours
    if hours is not None and not _within(hours, now or datetime.now(UTC)):
        return AccessDecision(
            False,
            f"partitions.{partition_name}.access_hours",
            f"outside the access hours {hours.start}-{hours.end} "
            f"(UTC{hours.utc_offset_hours:+g}) on {', '.join(hours.days)}",
        )
    return AccessDecision(
        True,
        f"partitions.{partition_name}.roles",
        f"{principal.name} holds {sorted(granted)} and meets {len(partition.attribute_rules)} "
        "attribute rule(s)",
    )
