"""The one classifier of runtime exceptions (framework/faults.py): a device fault becomes a
BackendError (retried elsewhere, counted by the breaker), an input fault an InvalidInputError
(a 400, nobody blamed). The torch exceptions are real ones, raised or built on this CPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from hetero.framework.errors import (
    BackendError,
    ExecutionError,
    InvalidInputError,
    OutOfDeviceMemoryError,
)
from hetero.framework.faults import classify_fault, is_device_fault, native_faults
from hetero.framework.stage_plugin import each

OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 1.06 GiB is free."
)


def raised(action: Callable[[], Any]) -> Exception:
    """What ``action`` raises (it must raise)."""
    try:
        action()
    except Exception as err:
        return err
    raise AssertionError("nothing was raised")


def engine_dead() -> Exception:
    """A stand-in for vLLM's ``EngineDeadError`` (vLLM is not installed here): the classifier
    knows runtimes' exception classes by module and name, so this is what it sees."""
    stand_in: type[Exception] = type(
        "EngineDeadError", (Exception,), {"__module__": "vllm.v1.engine.exceptions"}
    )
    return stand_in("EngineCore encountered an issue.")


DEVICE_FAULTS: dict[str, Callable[[], Exception]] = {
    "cuda out of memory": lambda: torch.cuda.OutOfMemoryError(OOM_MESSAGE),
    "device-side assert": lambda: torch.AcceleratorError(
        "CUDA error: device-side assert triggered"
    ),
    "cublas failure": lambda: RuntimeError(
        "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm(...)`"
    ),
    "runtime error not about the input": lambda: RuntimeError("unexpected kernel failure"),
    "host memory": MemoryError,
    "vllm engine died": engine_dead,
}

INPUT_FAULTS: dict[str, Callable[[], Exception]] = {
    "matmul shapes": lambda: raised(lambda: torch.ones(2, 3) @ torch.ones(4, 5)),
    "view of the wrong size": lambda: raised(lambda: torch.ones(5).view(2, 3)),
    "channels": lambda: raised(lambda: torch.nn.Conv2d(3, 4, 3)(torch.ones(1, 4, 8, 8))),
    "token id out of range": lambda: raised(lambda: torch.nn.Embedding(10, 4)(torch.tensor([12]))),
    "value error": lambda: ValueError("prompt is longer than the model's context"),
}


@pytest.mark.parametrize("make", DEVICE_FAULTS.values(), ids=DEVICE_FAULTS.keys())
def test_a_device_fault_becomes_a_backend_error(make: Callable[[], Exception]) -> None:
    err = make()
    assert is_device_fault(err)
    fault = classify_fault(err, "cuda:0", "llm_generate/decoder")
    assert isinstance(fault, ExecutionError) and isinstance(fault, BackendError)
    assert (fault.device, fault.graph) == ("cuda:0", "llm_generate/decoder")
    assert type(err).__name__ in str(fault)


@pytest.mark.parametrize("make", INPUT_FAULTS.values(), ids=INPUT_FAULTS.keys())
def test_a_shape_or_value_error_of_the_input_becomes_invalid_input(
    make: Callable[[], Exception],
) -> None:
    err = make()
    assert not is_device_fault(err)
    fault = classify_fault(err, "cuda:0", "decoder")
    assert isinstance(fault, InvalidInputError)
    assert str(err).splitlines()[0] in str(fault)


@pytest.mark.parametrize(
    "err",
    [
        InvalidInputError("no messages to answer"),
        OutOfDeviceMemoryError("cuda:0", 10, 1),
        TypeError("a bug, not the device and not the input"),
    ],
    ids=["hetero's own input error", "hetero's own device error", "a bug"],
)
def test_hetero_s_own_errors_and_bugs_are_left_as_they_are(err: Exception) -> None:
    assert classify_fault(err, "cuda:0", "decoder") is err


def test_native_faults_raises_the_classified_error_chained_to_the_runtime_s() -> None:
    oom = torch.cuda.OutOfMemoryError(OOM_MESSAGE)
    with pytest.raises(ExecutionError) as caught, native_faults("cuda:1", "decoder"):
        raise oom
    assert caught.value.__cause__ is oom
    assert caught.value.device == "cuda:1"
    with pytest.raises(TypeError) as left, native_faults("cuda:1", "decoder"):
        raise TypeError("a bug")
    assert left.value.__cause__ is None  # left as it is, not chained to itself


def test_each_raises_a_device_fault_and_keeps_an_input_fault_as_its_item_s_result() -> None:
    def step(payload: str) -> str:
        with native_faults("cuda:0", "decoder"):
            if payload == "oom":
                raise torch.cuda.OutOfMemoryError(OOM_MESSAGE)
            if payload == "bad":
                torch.ones(2, 3) @ torch.ones(4, 5)
        return payload

    (ok, bad) = each(step, ["fine", "bad"])
    assert ok == "fine" and isinstance(bad, InvalidInputError)
    with pytest.raises(ExecutionError):  # the batch fails: the engine retries it elsewhere
        each(step, ["fine", "oom"])

    def full(payload: str) -> str:
        raise OutOfDeviceMemoryError("cuda:0", 2, 1)

    with pytest.raises(OutOfDeviceMemoryError):  # hetero's device errors are raised too
        each(full, ["x"])
