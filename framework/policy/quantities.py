"""Numbers with units in policy files: ``80GiB``, ``2 TB/s``, ``312 TFLOPS``, ``1.5e9``.

PyYAML reads ``312e12`` as a string (YAML 1.1 wants a dot), so numbers in scientific notation
are accepted as strings too.
"""

from __future__ import annotations

import re

__all__ = ["parse_quantity"]

_PREFIXES = {
    "": 1.0,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
}
_UNITS = ("", "B", "B/s", "FLOPS", "FLOP/s", "FLOP")
_PATTERN = re.compile(
    r"^\s*(?P<number>[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?)\s*"
    r"(?P<prefix>Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P)?(?P<unit>[A-Za-z/]*)\s*$"
)


def parse_quantity(value: object, unit: str) -> float | object:
    """The number ``value`` stands for, in base units; non-quantities are returned unchanged.

    ``unit`` is the unit the field expects (``B``, ``B/s``, ``FLOPS``); a string may omit it or
    spell it out, but may not name a different unit.
    """
    if isinstance(value, bool) or not isinstance(value, str):
        return value
    match = _PATTERN.match(value)
    if match is None:
        return value
    spelled = match.group("unit")
    accepted = {"", unit}
    if unit == "FLOPS":
        accepted |= {"FLOP/s", "FLOP"}
    if spelled not in accepted or spelled not in _UNITS:
        return value
    return float(match.group("number")) * _PREFIXES[match.group("prefix") or ""]
