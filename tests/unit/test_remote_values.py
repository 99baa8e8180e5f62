"""`materialize`: every stand-in for a value kept on another node is fetched, wherever it sits
in a stage's output, and the containers keep their types (named tuples included)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from hetero.framework.remote import RemoteValue, materialize


class _Kept(RemoteValue):
    def __init__(self, value: Any) -> None:
        self.value = value
        self.fetched = 0

    def fetch(self) -> Any:
        self.fetched += 1
        return self.value


class _Labels(NamedTuple):
    top1: Any
    scores: Any


def test_stand_ins_are_fetched_in_dicts_lists_and_tuples() -> None:
    kept = _Kept(np.arange(3))
    out = materialize({"a": [kept, 1], "b": (kept,)})
    assert kept.fetched == 2
    assert isinstance(out["a"], list) and isinstance(out["b"], tuple)
    np.testing.assert_array_equal(out["a"][0], np.arange(3))
    assert out["a"][1] == 1


def test_a_named_tuple_keeps_its_type_and_fields() -> None:
    out = materialize(_Labels(top1=_Kept(7), scores=[0.5]))
    assert isinstance(out, _Labels)
    assert out.top1 == 7 and out.scores == [0.5]


def test_a_plain_value_is_returned_as_it_is() -> None:
    array = np.zeros(2)
    assert materialize(array) is array
