"""Checks that span keys: routes reach pipelines, pipelines reach stages, no cycles, and so on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyrsistent import pmap

from hetero.framework.device_presets import PRESETS
from hetero.framework.errors import CyclicPipelineError, PipelineError, PolicyValidationError
from hetero.framework.policy.schema import PolicySpec, SimulatedDeviceGroup
from hetero.framework.policy.yaml_source import LocatedYaml
from hetero.framework.stages import Pipeline, PipelineStep

__all__ = ["build_pipelines", "check_references", "resolve_group"]


def check_references(spec: PolicySpec, source: LocatedYaml) -> None:
    """Raise the first cross-reference problem, naming the key that holds the bad reference."""
    for name, stage in spec.stages.items():
        if "full" not in stage.variants:
            raise source.error(("stages", name, "variants"), "a stage needs a 'full' variant")
        if stage.partition is not None and stage.partition not in spec.partitions:
            raise source.error(
                ("stages", name, "partition"),
                _unknown("partition", stage.partition, spec.partitions),
            )
        if not stage.device_classes:
            raise source.error(("stages", name, "device_classes"), "allow at least one class")
        for variant_name, variant in stage.variants.items():
            if not variant.batchable and variant.max_batch != 1:
                raise source.error(
                    ("stages", name, "variants", variant_name, "max_batch"),
                    f"a variant that is not batchable has max_batch 1, got {variant.max_batch}",
                )
    for name, qos_class in spec.qos.classes.items():
        if qos_class.sla_tier not in spec.sla_tiers:
            raise source.error(
                ("qos", "classes", name, "sla_tier"),
                _unknown("SLA tier", qos_class.sla_tier, spec.sla_tiers),
            )
    if spec.qos.default_class not in spec.qos.classes:
        raise source.error(
            ("qos", "default_class"),
            _unknown("QoS class", spec.qos.default_class, spec.qos.classes),
        )
    weights = {name: c.weight for name, c in spec.qos.classes.items()}
    if spec.qos.aging_per_second == 0 and len(set(weights.values())) > 1:
        raise source.error(
            ("qos", "aging_per_second"),
            "must be positive when class weights differ, or the lowest class can starve",
        )
    for index, key in enumerate(spec.server.api_keys):
        if key.max_qos_class is not None and key.max_qos_class not in spec.qos.classes:
            raise source.error(
                ("server", "api_keys", index, "max_qos_class"),
                _unknown("QoS class", key.max_qos_class, spec.qos.classes),
            )
        if key.sla_tier is not None and key.sla_tier not in spec.sla_tiers:
            raise source.error(
                ("server", "api_keys", index, "sla_tier"),
                _unknown("SLA tier", key.sla_tier, spec.sla_tiers),
            )
    _check_simulated(spec, source)
    for route, target in spec.routes.items():
        if target not in spec.pipelines and target not in spec.stages:
            raise source.error(
                ("routes", route),
                f"no pipeline or stage named {target!r}"
                + _choices({**dict(spec.pipelines), **dict(spec.stages)}),
            )


_REQUIRED_FIGURES = ("class", "vendor_name", "memory", "memory_bandwidth", "peak_flops")


def _check_simulated(spec: PolicySpec, source: LocatedYaml) -> None:
    """Presets exist, every group has its figures, and links point at devices that exist."""
    seen_groups: set[str] = set()
    sim_ids: set[str] = set()
    for index, group in enumerate(spec.devices.simulated):
        key = ("devices", "simulated", index)
        if group.name in seen_groups:
            raise source.error((*key, "name"), "duplicate group name")
        seen_groups.add(group.name)
        if group.preset is not None and group.preset not in PRESETS:
            raise source.error(
                (*key, "preset"),
                f"unknown preset {group.preset!r} (known: {', '.join(sorted(PRESETS))})",
            )
        figures = resolve_group(group)
        missing = [name for name in _REQUIRED_FIGURES if figures.get(name) is None]
        if missing:
            raise source.error(key, f"needs {', '.join(missing)} (or a preset)")
        sim_ids.update(f"sim:{group.name}-{i}" for i in range(group.count * group.hosts))
    if not spec.devices.simulated:
        return
    for device_id, override in spec.devices.overrides.items():
        if device_id not in sim_ids:
            raise source.error(
                ("devices", "overrides", device_id), f"no simulated device {device_id!r}"
            )
        for index, link in enumerate(override.links or ()):
            if link.peer not in sim_ids:
                raise source.error(
                    ("devices", "overrides", device_id, "links", index, "peer"),
                    f"link to a missing device {link.peer!r}",
                )


def resolve_group(group: SimulatedDeviceGroup) -> dict[str, Any]:
    """A simulated group's figures: its preset's, overridden by what the group states."""
    figures: dict[str, Any] = dict(PRESETS.get(group.preset, {})) if group.preset else {}
    for name, field in type(group).model_fields.items():
        value = getattr(group, name)
        if value is not None and name not in {"name", "preset"}:
            figures[field.alias or name] = value
    figures.setdefault("interconnect", "none")
    return figures


def build_pipelines(spec: PolicySpec, source: LocatedYaml) -> Mapping[str, Pipeline]:
    """The checked DAG of every pipeline, plus a one-step pipeline for each stage a route names."""
    built: dict[str, Pipeline] = {}
    for name, config in spec.pipelines.items():
        steps: dict[str, PipelineStep] = {}
        previous: str | None = None
        for index, step in enumerate(config.steps):
            key = ("pipelines", name, "steps", index)
            if step.stage not in spec.stages:
                raise source.error((*key, "stage"), _unknown("stage", step.stage, spec.stages))
            step_name = step.name or step.stage
            if step_name in steps:
                raise source.error(key, f"step name {step_name!r} is used twice; give it a name")
            if step.after is None:
                after: tuple[str, ...] = (previous,) if previous else ()
            else:
                after = step.after
            steps[step_name] = PipelineStep(stage=step.stage, after=after)
            previous = step_name
        try:
            built[name] = Pipeline(name=name, steps=steps)
        except CyclicPipelineError as err:
            raise PolicyValidationError(
                source.path,
                source.line_of(("pipelines", name, "steps")),
                f"pipelines.{name}.steps",
                f"the steps form a cycle: {' -> '.join(err.cycle)}",
            ) from err
        except PipelineError as err:
            raise source.error(("pipelines", name, "steps"), str(err)) from err
    for target in spec.routes.values():
        if target in spec.stages and target not in built:
            built[target] = Pipeline(name=target, steps={target: PipelineStep(stage=target)})
    return pmap(built)


def _unknown(what: str, name: str, known: Mapping[str, object]) -> str:
    return f"unknown {what} {name!r}" + _choices(known)


def _choices(known: Mapping[str, object]) -> str:
    return f" (defined: {', '.join(sorted(known))})" if known else " (none defined)"
