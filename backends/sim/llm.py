"""Phases of an LLM run on a simulated device: prefill, then decode steps whose memory traffic
grows with the KV cache, each phase at its measured share of the roofline.

Prefill is compute-bound (prompt tokens x FLOPs per token over the peak); a decode step reads
the weights once for the batch plus every running sequence's KV cache (prompt + tokens
generated so far) and computes one token per running sequence; the batch runs until its
longest output is done (static batching), or, in a continuous batch, the running set changes
between steps (:func:`decode_steps` times either). Each phase is divided by the device's
efficiency from :mod:`hetero.backends.sim.calibration` (SplitwiseSim's measured A100/H100
table). Callers go through :mod:`hetero.backends.sim.timing` (:func:`modelled_run` for a run,
:func:`modelled_prefill` and :func:`modelled_steps` for a continuous batch's steps).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetero.backends.sim.calibration import efficiency_for
from hetero.framework.devices import DeviceSpec
from hetero.framework.graph import BandwidthHint

__all__ = ["decode_steps", "llm_phases", "prefill_seconds"]


def _per_token_flops(hint: BandwidthHint, nominal_tokens: float) -> float:
    return hint.flops_per_item / max(nominal_tokens, 1.0)


def prefill_seconds(
    hint: BandwidthHint, device: DeviceSpec, prompt_tokens: float, nominal_tokens: float
) -> float:
    """Seconds to prefill ``prompt_tokens`` tokens (all the sequences of one prefill step):
    compute-bound, at the device's measured prefill efficiency."""
    efficiency = efficiency_for(device.properties.get("preset"))
    peak = device.peak_flops_for(hint.dtype)
    return prompt_tokens * _per_token_flops(hint, nominal_tokens) / peak / efficiency.prefill


def decode_steps(
    hint: BandwidthHint,
    device: DeviceSpec,
    contexts: Sequence[int],
    remaining: Sequence[int],
    nominal_tokens: float,
) -> np.ndarray:
    """Seconds of each decode step of sequences holding ``contexts`` tokens of KV cache, each
    generating ``remaining`` more tokens (one per step; a sequence leaves after its last):
    ``max(remaining)`` steps. A step reads the weights once plus every running sequence's KV
    cache and computes one token per running sequence, at the measured decode efficiency."""
    efficiency = efficiency_for(device.properties.get("preset"))
    roofline: np.ndarray = _roofline_steps(hint, device, contexts, remaining, nominal_tokens)
    return roofline / efficiency.decode


def _roofline_steps(
    hint: BandwidthHint,
    device: DeviceSpec,
    contexts: Sequence[int],
    remaining: Sequence[int],
    nominal_tokens: float,
) -> np.ndarray:
    """Roofline seconds of each decode step (before the measured efficiency)."""
    longest = max(remaining, default=0)
    if longest <= 0:
        return np.zeros(0)
    peak = device.peak_flops_for(hint.dtype)
    bandwidth = device.memory_bandwidth_bytes_per_s
    flops_per_token = _per_token_flops(hint, nominal_tokens)
    step = np.arange(longest)
    context = np.asarray(contexts, dtype=float)[:, None]
    running = np.asarray(remaining)[:, None] > step[None, :]
    active = running.sum(axis=0)
    held = ((context + step[None, :]) * running).sum(axis=0)
    traffic = hint.resident_bytes + held * hint.kv_bytes_per_token
    step_s: np.ndarray = np.maximum(active * flops_per_token / peak, traffic / bandwidth)
    return step_s


def llm_phases(
    hint: BandwidthHint,
    device: DeviceSpec,
    prompts: Sequence[int],
    outputs: Sequence[int],
    nominal_tokens: float,
) -> tuple[float, float]:
    """Prefill and decode seconds of a static batch of sequences with these prompt and output
    lengths: one prefill of every prompt, then decode steps until the longest output is done.

    ``hint.flops_per_item`` describes a nominal request of ``nominal_tokens`` tokens (prompt
    plus output), so one token costs ``flops_per_item / nominal_tokens``; the weights are
    ``hint.resident_bytes``.
    """
    prefill = prefill_seconds(hint, device, sum(prompts), nominal_tokens)
    efficiency = efficiency_for(device.properties.get("preset"))
    # summed, then divided (not decode_steps' per-step division): static batches keep the
    # figures they had to the last bit
    steps = _roofline_steps(hint, device, prompts, outputs, nominal_tokens)
    return prefill, float(steps.sum()) / efficiency.decode
