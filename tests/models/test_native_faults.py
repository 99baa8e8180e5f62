"""The real LLM and ASR decoding loops name a device fault as one: a CUDA out-of-memory raised
mid-decode fails the batch with an ExecutionError (a BackendError: the engine retries it on
another device, the breaker counts it), not the item as bad input.

No GPU here: a forward pre-hook on the real torch module raises a real
``torch.cuda.OutOfMemoryError`` at the step chosen (a fake of the GPU failing, nothing else).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from hetero.framework.errors import ExecutionError
from hetero.framework.stage_plugin import Generation
from hetero.models.asr import SpeechRecognizer
from hetero.models.llm import TextGenerator

OOM = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.19 GiB"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@contextmanager
def failing_at(module: torch.nn.Module, call: int, error: Exception) -> Iterator[list[int]]:
    """``module``'s ``call``-th forward raises ``error``; yields the count of forwards."""
    calls = [0]

    def hook(_module: torch.nn.Module, _args: Any) -> None:
        calls[0] += 1
        if calls[0] == call:
            raise error

    handle = module.register_forward_pre_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def raises_device_fault(run: Callable[[], Any], error: Exception) -> ExecutionError:
    with pytest.raises(ExecutionError) as caught:
        run()
    assert caught.value.__cause__ is error
    assert "OutOfMemoryError: CUDA out of memory" in str(caught.value)
    return caught.value


def test_a_cuda_oom_mid_decode_of_the_llm_is_a_device_fault(generator: TextGenerator) -> None:
    runner = generator.runner
    error = torch.cuda.OutOfMemoryError(OOM)
    job = Generation(QUESTION, max_tokens=8)
    pieces: list[str] = []
    job.on_piece = pieces.append
    with failing_at(runner.native("decoder"), 3, error) as calls:
        fault = raises_device_fault(lambda: generator.run(runner, "full", [job]), error)
    assert calls == [3]  # the prompt and one step ran: it failed mid-decode
    assert pieces  # text was already streamed when the device failed
    assert fault.device == runner.device_id


def test_a_cuda_oom_mid_decode_of_the_asr_is_a_device_fault(
    recognizer: SpeechRecognizer, sentence_wav: bytes
) -> None:
    runner = recognizer.runner
    error = torch.cuda.OutOfMemoryError(OOM)
    with failing_at(runner.native("decoder").decoder, 2, error) as calls:
        raises_device_fault(lambda: recognizer.run(runner, "full", [sentence_wav]), error)
    assert calls == [2]
