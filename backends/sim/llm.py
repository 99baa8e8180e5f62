"""Phases of an LLM run on a simulated device: prefill, then decode steps whose memory traffic
grows with the KV cache, each phase at its measured share of the roofline.

Prefill is compute-bound (prompt tokens x FLOPs per token over the peak); a decode step reads
the weights once for the batch plus every running sequence's KV cache (prompt + tokens
generated so far) and computes one token per running sequence; the batch runs until its
longest output is done (static batching). Each phase is divided by the device's efficiency from
:mod:`hetero.backends.sim.calibration` (SplitwiseSim's measured A100/H100 table). Callers go
through :func:`hetero.backends.sim.timing.modelled_run`, the one formula.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetero.backends.sim.calibration import efficiency_for
from hetero.framework.devices import DeviceSpec
from hetero.framework.graph import BandwidthHint

__all__ = ["llm_phases"]


def llm_phases(
    hint: BandwidthHint,
    device: DeviceSpec,
    prompts: Sequence[int],
    outputs: Sequence[int],
    nominal_tokens: float,
) -> tuple[float, float]:
    """Prefill and decode seconds of sequences with these prompt and output lengths.

    ``hint.flops_per_item`` describes a nominal request of ``nominal_tokens`` tokens (prompt
    plus output), so one token costs ``flops_per_item / nominal_tokens``; the weights are
    ``hint.resident_bytes``.
    """
    efficiency = efficiency_for(device.properties.get("preset"))
    peak = device.peak_flops_for(hint.dtype)
    bandwidth = device.memory_bandwidth_bytes_per_s
    flops_per_token = hint.flops_per_item / max(nominal_tokens, 1.0)
    prefill = sum(prompts) * flops_per_token / peak / efficiency.prefill
    longest = max(outputs, default=0)
    if longest <= 0:
        return prefill, 0.0
    step = np.arange(longest)
    prompt = np.asarray(prompts, dtype=float)[:, None]
    running = np.asarray(outputs)[:, None] > step[None, :]
    active = running.sum(axis=0)
    context = ((prompt + step[None, :]) * running).sum(axis=0)
    traffic = hint.resident_bytes + context * hint.kv_bytes_per_token
    step_s = np.maximum(active * flops_per_token / peak, traffic / bandwidth)
    return prefill, float(step_s.sum()) / efficiency.decode
