"""Pydantic's validation errors, rewritten as one plain sentence per problem."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from hetero.framework.policy.yaml_source import KeyPath

__all__ = ["describe_errors"]


def describe_errors(error: ValidationError, root: type[BaseModel]) -> list[tuple[KeyPath, str]]:
    """``(key path, message)`` per error, in the order pydantic found them."""
    described = []
    for detail in error.errors(include_url=False):
        loc = tuple(detail["loc"])
        key_path: KeyPath = tuple(part for part in loc if part != "[key]")
        described.append((key_path, _message(detail, loc, root)))
    return described


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return repr(value)


def _message(detail: ErrorDetails, loc: tuple[Any, ...], root: type[BaseModel]) -> str:
    kind = detail["type"]
    ctx = detail.get("ctx", {})
    got = _show(detail.get("input"))
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        return _unknown_key(loc, root)
    if kind == "literal_error":
        if loc and loc[-1] == "[key]":
            return f"unknown key {loc[-2]!r}, expected {ctx.get('expected', '')}"
        return f"expected {ctx.get('expected', 'one of the listed values')}, got {got}"
    if kind in {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}:
        return _bound_message(kind, ctx, _wants_integer(root, loc, detail.get("input")), got)
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        return f"expected an integer, got {got}"
    if kind in {"float_type", "float_parsing"}:
        return f"expected a number, got {got}"
    if kind in {"bool_type", "bool_parsing"}:
        return f"expected true or false, got {got}"
    if kind in {"string_type"}:
        return f"expected a string, got {got}"
    if kind in {"dict_type", "model_type", "model_attributes_type", "mapping_type"}:
        return f"expected a mapping, got {got}"
    if kind in {"list_type", "tuple_type"}:
        return f"expected a list, got {got}"
    if kind == "too_short":
        return f"expected at least {ctx.get('min_length', 1)} item(s), got {got}"
    if kind == "string_pattern_mismatch":
        return f"expected a value matching {ctx.get('pattern')!r}, got {got}"
    if kind == "value_error":
        return str(ctx.get("error", detail["msg"]))
    return f"{detail['msg']}, got {got}"


def _wants_integer(root: type[BaseModel], loc: tuple[Any, ...], value: Any) -> bool:
    """Whether the field at ``loc`` is an integer field (falls back to the value's type)."""
    model = _model_at(root, loc[:-1]) if loc else None
    field = model.model_fields.get(str(loc[-1])) if model is not None else None
    if field is None:
        return isinstance(value, int) and not isinstance(value, bool)
    return _strip(field.annotation) is int


def _bound_message(kind: str, ctx: dict[str, Any], integer: bool, got: str) -> str:
    noun = "integer" if integer else "number"
    if kind == "greater_than" and ctx.get("gt") == 0:
        return f"expected a positive {noun}, got {got}"
    if kind == "greater_than_equal" and ctx.get("ge") == 0:
        return f"expected a non-negative {noun}, got {got}"
    words = {
        "greater_than": "greater than",
        "greater_than_equal": "at least",
        "less_than": "less than",
        "less_than_equal": "at most",
    }
    bound = next(iter(ctx.values()), "?")
    return f"expected a {noun} {words[kind]} {bound}, got {got}"


def _unknown_key(loc: tuple[Any, ...], root: type[BaseModel]) -> str:
    key = str(loc[-1]) if loc else "?"
    model = _model_at(root, loc[:-1])
    if model is None:
        return f"unknown key {key!r}"
    allowed = sorted(field.alias or name for name, field in model.model_fields.items())
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; allowed: {', '.join(allowed)}"
    return f"unknown key {key!r}{hint}"


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``loc``, following fields and map values."""
    current: Any = root
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        current = _strip(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = next((f for n, f in current.model_fields.items() if part in (n, f.alias)), None)
            if field is None:
                return None
            current = field.annotation
            continue
        origin = typing.get_origin(current)
        args = typing.get_args(current)
        if origin is not None and args:
            current = args[-1] if len(args) == 2 and args[-1] is not Ellipsis else args[0]
            continue
        return None
    current = _strip(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _strip(annotation: Any) -> Any:
    """Unwrap Annotated and Optional."""
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) == 1:
                annotation = members[0]
                continue
        return annotation
