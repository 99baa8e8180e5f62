"""The policy schema's building blocks: the frozen base model and the field types (quantities
with units, bounded numbers, names) every part of the schema (:mod:`.schema`,
:mod:`.compliance_schema`) is made of."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
)
from pyrsistent import pmap

from hetero.framework.policy.quantities import parse_quantity

DeviceClassName = Literal["cuda", "rocm", "npu", "cpu"]

CIPHERS = ("AES-256-GCM", "SM4-GCM")
DEVICE_CLASSES: tuple[DeviceClassName, ...] = ("cuda", "rocm", "npu", "cpu")
PositiveInt = Annotated[StrictInt, Field(gt=0)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
OpenFraction = Annotated[float, Field(gt=0.0, lt=1.0)]
PositiveFloat = Annotated[float, Field(gt=0.0)]
NonNegativeFloat = Annotated[float, Field(ge=0.0)]
Name = Annotated[StrictStr, Field(min_length=1)]


def _bytes(value: object) -> object:
    parsed = parse_quantity(value, "B")
    if isinstance(parsed, float) and parsed.is_integer():
        return int(parsed)
    return parsed


def _rate(unit: str) -> BeforeValidator:
    return BeforeValidator(lambda value: parse_quantity(value, unit))


Bytes = Annotated[StrictInt, BeforeValidator(_bytes), Field(ge=0)]
PositiveBytes = Annotated[StrictInt, BeforeValidator(_bytes), Field(gt=0)]
Bandwidth = Annotated[float, _rate("B/s"), Field(gt=0.0)]
Flops = Annotated[float, _rate("FLOPS"), Field(gt=0.0)]
FlopCount = Annotated[float, _rate("FLOPS"), Field(ge=0.0)]
ByteCount = Annotated[float, _rate("B"), Field(ge=0.0)]


def freeze(value: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return pmap(value)


class Frozen(BaseModel):
    """A policy block: immutable, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
