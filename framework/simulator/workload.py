"""Workloads: a small YAML file saying how requests arrive and what they look like.

Kinds of arrival:

* ``poisson``: open loop at ``rate_per_s``; ``gamma``: open loop, bursty, inter-arrival
  coefficient of variation ``cv`` (1 is Poisson);
* ``closed_loop``: ``clients`` concurrent clients, each sending its next request
  ``think_time_s`` after the previous one finished;
* ``trace``: replay a file in the documented CSV/JSONL format (:mod:`traces`);
* ``azure``: replay the Azure LLM inference 2023 trace, each row a text request to
  ``azure.route``, with image and audio requests from ``mix`` mixed in at stated ratios.

Synthetic requests are drawn from ``mix`` by weight. Every draw uses ``seed``, so every placement
policy sees the identical arrival sequence. Requests arriving before ``warmup_s`` run but are
left out of the latency figures (models loading onto empty devices is start-up, not service).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from hetero.backends.sim.timing import DEFAULT_NOMINAL_TOKENS
from hetero.framework.errors import PolicyValidationError
from hetero.framework.policy.messages import describe_errors
from hetero.framework.policy.yaml_source import load_located

__all__ = ["RequestKind", "SimRequest", "WorkloadSpec", "load_workload"]

NonNegative = Annotated[float, Field(ge=0.0)]
Positive = Annotated[float, Field(gt=0.0)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RequestKind(_Frozen):
    """One kind of request in a synthetic mix."""

    route: StrictStr
    weight: Positive = 1.0
    qos: StrictStr | None = None
    text_tokens: Annotated[StrictInt, Field(ge=0)] = 0
    output_tokens: Annotated[StrictInt, Field(ge=0)] = 0
    images: Annotated[StrictInt, Field(ge=0)] = 0
    image_pixels: Annotated[StrictInt, Field(ge=0)] = 0
    audio_seconds: NonNegative = 0.0
    tenant: StrictStr | None = None  # who sends it: held to a fair share of each stage


class Arrivals(_Frozen):
    """How requests arrive."""

    kind: Literal["poisson", "gamma", "closed_loop", "trace", "azure"]
    rate_per_s: Positive | None = None
    cv: Positive = 1.0
    clients: Annotated[StrictInt, Field(gt=0)] | None = None
    think_time_s: NonNegative = 0.0
    path: StrictStr | None = None
    limit: Annotated[StrictInt, Field(gt=0)] | None = None


class AzureMapping(_Frozen):
    """How Azure trace rows become requests."""

    route: StrictStr
    qos: StrictStr | None = None
    image_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    audio_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0


class Nominal(_Frozen):
    """The request size a stage's BandwidthHint describes: work scales from it. ``nominal``
    sets it for every stage; ``stage_nominal`` per stage (an embedder's hint may describe 256
    tokens where the LLM's describes 768)."""

    text_tokens: Positive = DEFAULT_NOMINAL_TOKENS
    image_pixels: Positive = 336.0 * 336.0
    audio_seconds: Positive = 30.0


class WorkloadSpec(_Frozen):
    """A workload file."""

    name: StrictStr = "workload"
    seed: StrictInt = 0
    duration_s: Positive = 600.0
    warmup_s: NonNegative = 0.0
    arrivals: Arrivals
    mix: tuple[RequestKind, ...] = ()
    azure: AzureMapping | None = None
    nominal: Nominal = Nominal()
    stage_nominal: Mapping[StrictStr, Nominal] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request the simulator replays."""

    index: int
    arrival: float
    route: str
    qos: str | None
    text_tokens: int = 0
    output_tokens: int = 0
    images: int = 0
    image_pixels: int = 0
    audio_seconds: float = 0.0
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    """A validated workload and where it came from (relative paths resolve from there)."""

    spec: WorkloadSpec
    source: Path


def load_workload(path: str | Path) -> Workload:
    """Validate a workload file; errors name the file, line and key."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise PolicyValidationError(str(file), None, "", "workload file not found") from err
    located = load_located(text, str(file))
    if not isinstance(located.data, dict):
        raise PolicyValidationError(str(file), 1, "", "a workload must be a mapping of keys")
    try:
        spec = WorkloadSpec.model_validate(located.data)
    except ValidationError as err:
        problems = describe_errors(err, WorkloadSpec)
        key_path, message = min(problems, key=lambda item: located.line_of(item[0]) or 0)
        raise located.error(key_path, message) from None
    _check(spec, located)
    return Workload(spec=spec, source=file)


def _check(spec: WorkloadSpec, located: object) -> None:
    from hetero.framework.policy.yaml_source import LocatedYaml

    assert isinstance(located, LocatedYaml)
    kind = spec.arrivals.kind
    needs: Mapping[str, tuple[str, ...]] = {
        "poisson": ("rate_per_s",),
        "gamma": ("rate_per_s",),
        "closed_loop": ("clients",),
        "trace": ("path",),
        "azure": ("path",),
    }
    for key in needs[kind]:
        if getattr(spec.arrivals, key) is None:
            raise located.error(("arrivals",), f"{kind} arrivals need {key}")
    if kind in {"poisson", "gamma", "closed_loop"} and not spec.mix:
        raise located.error(("mix",), f"{kind} arrivals draw requests from mix: give at least one")
    if kind == "azure" and spec.azure is None:
        raise located.error(("azure",), "azure arrivals need the azure mapping (route, ratios)")
    if spec.azure is not None:
        if spec.azure.image_ratio + spec.azure.audio_ratio > 1:
            raise located.error(("azure",), "image_ratio + audio_ratio must not exceed 1")
        if spec.azure.image_ratio and not any(k.images for k in spec.mix):
            raise located.error(("azure", "image_ratio"), "needs a mix entry with images")
        if spec.azure.audio_ratio and not any(k.audio_seconds for k in spec.mix):
            raise located.error(("azure", "audio_ratio"), "needs a mix entry with audio_seconds")
