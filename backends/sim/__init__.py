"""The simulated backend: devices declared in a policy, from presets or explicit figures.

It runs nothing. A run returns no outputs and the modelled duration
(:func:`modelled_run`: the roofline batch time, or prefill plus decode over a growing KV cache
for an LLM graph), the one formula the simulator uses too, so the scheduler and the simulator
can use it on a virtual clock. Everything else (compile checks, memory accounting, errors)
behaves as a real backend's, so it passes the conformance suite's parts that apply.
"""

from hetero.backends.sim.backend import SimBackend
from hetero.backends.sim.detect import detect
from hetero.backends.sim.timing import LlmSequences, RunTime, modelled_run

__all__ = [
    "LlmSequences",
    "RunTime",
    "SimBackend",
    "detect",
    "modelled_run",
]
