"""The one formula for the modelled duration of a run on a simulated device.

Both users call :func:`modelled_run`: the sim backend for every run the engine makes on it,
and the simulator for every batch it starts. A graph without a KV cache takes the roofline
batch time (:meth:`BandwidthHint.batch_seconds`: weights read once per batch); an LLM graph
(its hint has ``kv_bytes_per_token``) takes prefill plus decode steps over a growing KV cache,
each phase at its measured share of the roofline (:func:`hetero.backends.sim.llm.llm_phases`,
calibrated from SplitwiseSim's A100/H100 table). Either way a fixed launch overhead is added.

A continuous (iteration-level) batch, as vLLM runs one, is timed by the same phases taken
apart: :func:`modelled_prefill` for the prefill step of the sequences that join (with the launch
overhead) and :func:`modelled_steps` for the decode steps of the running set, so one sequence
alone takes exactly what :func:`modelled_run` gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetero.backends.sim.llm import decode_steps, llm_phases, prefill_seconds
from hetero.framework.devices import DeviceSpec
from hetero.framework.graph import BandwidthHint

__all__ = [
    "DEFAULT_NOMINAL_TOKENS",
    "LAUNCH_OVERHEAD_S",
    "LlmSequences",
    "RunTime",
    "modelled_prefill",
    "modelled_run",
    "modelled_steps",
]

# Fixed cost of one launch (kernel launches, synchronisation); NVIDIA quotes a few microseconds
# per kernel launch and a whole model takes tens of them.
LAUNCH_OVERHEAD_S = 20e-6

# Tokens (prompt plus output) of the nominal request an LLM hint's ``flops_per_item`` describes,
# unless a workload says otherwise (``nominal.text_tokens``).
DEFAULT_NOMINAL_TOKENS = 768.0


@dataclass(frozen=True, slots=True)
class LlmSequences:
    """The sequences of an LLM run: each one's prompt and output length in tokens, and the
    tokens of the nominal request the hint's ``flops_per_item`` describes."""

    prompts: Sequence[int]
    outputs: Sequence[int]
    nominal_tokens: float = DEFAULT_NOMINAL_TOKENS

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.outputs):
            raise ValueError(
                f"{len(self.prompts)} prompt lengths but {len(self.outputs)} output lengths"
            )
        if any(t < 0 for t in self.prompts) or any(t < 0 for t in self.outputs):
            raise ValueError("token counts must not be negative")
        if self.nominal_tokens <= 0:
            raise ValueError(f"nominal_tokens must be positive, got {self.nominal_tokens}")


@dataclass(frozen=True, slots=True)
class RunTime:
    """A modelled run: its whole duration and, for an LLM run, its two phases (zero
    otherwise); ``seconds`` = launch overhead + prefill + decode for an LLM run."""

    seconds: float
    prefill_s: float = 0.0
    decode_s: float = 0.0


def modelled_run(
    hint: BandwidthHint,
    device: DeviceSpec,
    items: float,
    sequences: LlmSequences | None = None,
) -> RunTime:
    """Modelled duration of one run of ``items`` nominal items (fractional when items of
    different sizes add up) on ``device``.

    Raises:
        ValueError: an LLM hint without ``sequences``: its time depends on each sequence's
            prompt and output length, which a nominal item count does not say.
    """
    if not hint.kv_bytes_per_token:
        peak = device.peak_flops_for(hint.dtype)
        bandwidth = device.memory_bandwidth_bytes_per_s
        return RunTime(LAUNCH_OVERHEAD_S + hint.batch_seconds(peak, bandwidth, items))
    if sequences is None:
        raise ValueError(
            "an LLM graph (kv_bytes_per_token set) is timed per sequence: give each "
            "sequence's prompt and output length"
        )
    prefill, decode = llm_phases(
        hint, device, sequences.prompts, sequences.outputs, sequences.nominal_tokens
    )
    return RunTime(LAUNCH_OVERHEAD_S + prefill + decode, prefill, decode)


def modelled_prefill(
    hint: BandwidthHint, device: DeviceSpec, prompts: Sequence[int], nominal_tokens: float
) -> float:
    """Seconds of one prefill step of a continuous batch: the launch overhead plus the prefill
    of every joining sequence's ``prompts`` (the phase :func:`modelled_run` starts with)."""
    return LAUNCH_OVERHEAD_S + prefill_seconds(hint, device, sum(prompts), nominal_tokens)


def modelled_steps(
    hint: BandwidthHint,
    device: DeviceSpec,
    contexts: Sequence[int],
    remaining: Sequence[int],
    nominal_tokens: float,
) -> np.ndarray:
    """Seconds of each decode step of a continuous batch whose sequences hold ``contexts``
    tokens of KV cache and have ``remaining`` tokens to generate (the decode phase of
    :func:`modelled_run`, from any point of the sequences' lives)."""
    return decode_steps(hint, device, contexts, remaining, nominal_tokens)
