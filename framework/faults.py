"""Whose fault is it: the device's or the input's? One classifier for what runtimes raise.

A backend translates what its runtime raises in a graph run (``Backend.run``); a stage that
drives a native handle itself (a torch KV-cache decoder, a vLLM engine) sees the runtime's own
exceptions. :func:`classify_fault` names them the way the engine acts on them:

* a **device fault** (CUDA out of memory, a device-side assert, an engine process that died,
  any other ``RuntimeError`` from the runtime that is not about the input) becomes an
  :class:`~hetero.framework.errors.ExecutionError`, a ``BackendError``: the engine retries the
  request on another device and the (stage, device) breaker counts the failure;
* an **input fault** (a ``ValueError`` or ``IndexError``, a runtime's complaint about a shape,
  size or dtype) becomes an :class:`~hetero.framework.errors.InvalidInputError`: that request
  fails with a 400, and no device is blamed;
* anything else (hetero's own errors, a bug such as a ``TypeError``) is left as it is.

Runtime exception types are recognised by module and class name, so nothing here imports
torch, vLLM or ONNX Runtime.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import NoReturn

from hetero.framework.errors import ExecutionError, HeteroError, InvalidInputError

__all__ = [
    "DEVICE_FAULT_TYPES",
    "classify_fault",
    "describe",
    "is_device_fault",
    "native_faults",
    "raise_classified",
]

DEVICE_FAULT_TYPES: Mapping[str, frozenset[str]] = {
    # torch.cuda.OutOfMemoryError is torch.OutOfMemoryError; AcceleratorError: CUDA errors
    "torch": frozenset({"OutOfMemoryError", "AcceleratorError"}),
    # vllm.v1.engine.exceptions: the engine core died or failed the request; the waiting queue
    # is full (a ValueError in vLLM, but the device's state, not the input's)
    "vllm": frozenset(
        {
            "EngineDeadError",
            "EngineGenerateError",
            "EngineSleepingError",
            "SchedulerWaitingQueueFullError",
        }
    ),
    # onnxruntime.capi.onnxruntime_pybind11_state: plain Exceptions, not RuntimeErrors
    "onnxruntime": frozenset({"Fail", "EPFail", "RuntimeException", "EngineError"}),
}
"""Exception classes that are device faults whatever their base, by top-level module."""

INPUT_FAULT_TYPES: Mapping[str, frozenset[str]] = {
    "onnxruntime": frozenset({"InvalidArgument"}),
}
"""Exception classes that are input faults whatever their base, by top-level module."""

_DEVICE_MESSAGE = re.compile(
    r"CUDA|cuDNN|CUBLAS|cuBLAS|CUFFT|NCCL|HIP error|hipError|out of memory|"
    r"device-side assert|illegal memory access|ECC error|launch failure|unspecified launch"
)
_INPUT_MESSAGE = re.compile(
    r"shape|size of tensor|sizes of tensors|must match the size|dimension|channels|dtype|"
    r"scalar type|cannot be multiplied|is invalid for input of size|out of range|out of bounds",
    re.IGNORECASE,
)
_LOCATOR = re.compile(r"^(Exception from )?\S+\.(cpp|cc|h|hpp):\d+:?$")
DESCRIBE_LIMIT = 2000


def describe(err: BaseException) -> str:
    """The error's type and message on one line: every line of it, without the bare source
    locators runtimes put first (OpenVINO's ``Exception from src/.../core.cpp:84:``, which
    alone says nothing of the cause), at most 2,000 characters."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    causes = [line for line in lines if not _LOCATOR.match(line)] or lines
    text = " | ".join(causes)
    if len(text) > DESCRIBE_LIMIT:
        text = text[: DESCRIBE_LIMIT - 3] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _named_in(err: BaseException, table: Mapping[str, frozenset[str]]) -> bool:
    """Whether ``err``'s class, or a class it derives from, is listed in ``table``."""
    for cls in type(err).__mro__:
        top = cls.__module__.split(".", 1)[0]
        if cls.__name__ in table.get(top, ()):
            return True
    return False


def is_device_fault(err: BaseException) -> bool:
    """Whether ``err``, raised by a runtime, is the device's failure rather than the input's
    (see the module doc); hetero's own errors are never reclassified."""
    if isinstance(err, HeteroError):
        return False
    if _named_in(err, DEVICE_FAULT_TYPES) or isinstance(err, MemoryError):
        return True
    if _named_in(err, INPUT_FAULT_TYPES):
        return False
    if isinstance(err, RuntimeError):
        message = str(err)
        return bool(_DEVICE_MESSAGE.search(message)) or not _INPUT_MESSAGE.search(message)
    return False


def _is_input_fault(err: BaseException) -> bool:
    if isinstance(err, HeteroError) or is_device_fault(err):
        return False
    return (
        _named_in(err, INPUT_FAULT_TYPES)
        or isinstance(err, ValueError | IndexError | RuntimeError)  # RuntimeError: shape/dtype
    )


def classify_fault(err: Exception, device_id: str, graph: str) -> Exception:
    """``err`` as the engine should see it: an :class:`ExecutionError` (a ``BackendError``)
    for a device fault, an :class:`InvalidInputError` for an input fault, ``err`` itself
    otherwise. ``device_id`` and ``graph`` name where it ran, for the message."""
    if is_device_fault(err):
        return ExecutionError(device_id, graph, describe(err))
    if _is_input_fault(err):
        return InvalidInputError(f"{graph}: the model cannot take this input: {describe(err)}")
    return err


def raise_classified(err: Exception, device_id: str, graph: str) -> NoReturn:
    """Raise :func:`classify_fault` of ``err``, chained to ``err`` when it was translated."""
    fault = classify_fault(err, device_id, graph)
    if fault is err:
        raise err
    raise fault from err


@contextmanager
def native_faults(device_id: str, graph: str) -> Iterator[None]:
    """Classify what a loop over a native handle raises (:func:`classify_fault`).

    Wrap the runtime calls only: an exception of the stage's own callbacks (a stream's
    ``on_piece``) is not the device's, and must not be raised from inside this block.
    """
    try:
        yield
    except Exception as err:
        raise_classified(err, device_id, graph)
