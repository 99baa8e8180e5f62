"""``hetero plan``: per stage and variant, the eligible devices and the roofline cost per item."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetero.framework.devices import DeviceSpec
from hetero.framework.errors import PolicyError
from hetero.framework.fleet import Fleet
from hetero.framework.graph import BandwidthHint
from hetero.framework.locality import locality_mismatch
from hetero.framework.policy import Policy
from hetero.framework.policy.hints import hint_from_variant
from hetero.framework.topology import host_link

__all__ = ["DeviceCost", "StagePlan", "plan_policy"]


@dataclass(frozen=True, slots=True)
class DeviceCost:
    """The roofline estimate of one item of a stage variant on one device.

    Attributes:
        device_id: The device.
        compute_s: FLOPs over peak FLOP/s for the variant's dtype.
        memory_s: Bytes moved over memory bandwidth.
        per_item_s: The slower of the two: what the roofline predicts.
        load_s: Time to bring the model's resident bytes onto the device once.
        bound: ``compute`` or ``memory``.
    """

    device_id: str
    compute_s: float
    memory_s: float
    per_item_s: float
    load_s: float
    bound: str


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One stage variant: devices it may run on, cheapest first, and those ruled out."""

    stage: str
    variant: str
    arithmetic_intensity: float
    costs: tuple[DeviceCost, ...]
    ineligible: tuple[tuple[str, str], ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "stage": self.stage,
            "variant": self.variant,
            "arithmetic_intensity": self.arithmetic_intensity,
            "devices": [
                {
                    "id": c.device_id,
                    "per_item_s": c.per_item_s,
                    "compute_s": c.compute_s,
                    "memory_s": c.memory_s,
                    "load_s": c.load_s,
                    "bound": c.bound,
                }
                for c in self.costs
            ],
            "ineligible": [{"id": d, "reason": r} for d, r in self.ineligible],
        }


def cost_on(hint: BandwidthHint, device: DeviceSpec) -> DeviceCost:
    """Roofline cost of one item of ``hint`` on ``device``."""
    compute = hint.flops_per_item / device.peak_flops_for(hint.dtype)
    memory = hint.bytes_per_item / device.memory_bandwidth_bytes_per_s
    return DeviceCost(
        device_id=device.id,
        compute_s=compute,
        memory_s=memory,
        per_item_s=max(compute, memory),
        load_s=hint.resident_bytes / host_link(device)[0],
        bound="compute" if compute >= memory else "memory",
    )


def plan_policy(
    policy: Policy, fleet: Fleet, hints: Mapping[str, BandwidthHint] | None = None
) -> list[StagePlan]:
    """Every stage variant of ``policy`` costed on every device of ``fleet``; ``hints``
    (``stage/variant``: the stage plugins' graph hints) come before the policy's figures.

    Raises:
        PolicyError: a stage has neither a plugin's hint nor cost figures.
    """
    reserve = policy.spec.scheduler.memory_reserve_fraction
    plans = []
    for stage_name, stage in sorted(policy.spec.stages.items()):
        for variant_name in ("full", "light"):
            variant = stage.variants.get(variant_name)
            if variant is None:
                continue
            hint = (hints or {}).get(f"{stage_name}/{variant_name}") or hint_from_variant(variant)
            if hint is None:
                raise PolicyError(
                    f"{policy.source}: stages.{stage_name}.variants.{variant_name}: no stage "
                    "plugin serves this stage, so flops_per_item and bytes_per_item are needed"
                )
            costs = []
            ineligible = []
            for device in fleet.devices:
                misplaced = locality_mismatch(stage.locality, device)
                if misplaced and stage.locality is not None and stage.locality.mode == "require":
                    ineligible.append((device.id, misplaced))
                elif device.device_class.value not in stage.device_classes:
                    ineligible.append((device.id, f"class {device.device_class.value} not allowed"))
                elif hint.resident_bytes > device.memory_bytes * (1 - reserve):
                    ineligible.append((device.id, "model does not fit beside the memory reserve"))
                else:
                    costs.append(cost_on(hint, device))
            if not costs and stage.locality is not None and stage.locality.mode == "require":
                raise PolicyError(
                    f"{policy.source}: stages.{stage_name}.locality: no device satisfies it "
                    f"({'; '.join(f'{d}: {r}' for d, r in ineligible)})"
                )
            preferred = {
                device.id
                for device in fleet.devices
                if not locality_mismatch(stage.locality, device)
            }
            # Matching devices first where the stage prefers a place, then the cheapest.
            costs.sort(
                key=lambda cost: (cost.device_id not in preferred, cost.per_item_s, cost.device_id)
            )
            plans.append(
                StagePlan(
                    stage=stage_name,
                    variant=variant_name,
                    arithmetic_intensity=hint.arithmetic_intensity,
                    costs=tuple(costs),
                    ineligible=tuple(ineligible),
                )
            )
    return plans
