"""One measure of an output's bytes, for transfer costs and for what a device actor keeps."""

from __future__ import annotations

import numpy as np
import torch

from hetero.framework.cluster.kept import INLINE_BYTES, describe
from hetero.framework.sizes import nbytes_of


def test_arrays_tensors_text_and_their_containers_are_counted() -> None:
    array = np.zeros((4, 8), np.float32)  # 128 bytes
    tensor = torch.zeros(16, dtype=torch.float16)  # 32 bytes
    assert nbytes_of(array) == 128 and nbytes_of(tensor) == 32
    assert nbytes_of(b"abc") == 3 and nbytes_of("héllo") == 5 and nbytes_of(bytearray(7)) == 7
    assert nbytes_of([array, (tensor, b"ab")]) == 162  # lists and tuples: summed
    assert nbytes_of({"a": array, "b": {"c": [tensor]}}) == 160
    assert nbytes_of(None) == 0 and nbytes_of(3.5) == 0 and nbytes_of(True) == 0


def test_a_large_list_output_is_kept_on_the_node_not_answered_inline() -> None:
    rows = [np.zeros(INLINE_BYTES // 8, np.float32) for _ in range(4)]  # half the bound each
    assert describe(rows)[0] == "value"  # counted as 0 bytes before: sent back inline
    assert describe(rows[:1])[0] == "inline"  # the control: under the bound
