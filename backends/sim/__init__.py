"""The simulated backend: devices declared in a policy, from presets or explicit figures.

It runs nothing. A run returns no outputs and the modelled duration (roofline from the
BandwidthHint plus batch effects, :func:`modelled_batch_seconds`), so the scheduler and the
simulator can use it on a virtual clock. Everything else (compile checks, memory accounting,
errors) behaves as a real backend's, so it passes the conformance suite's parts that apply.
"""

from hetero.backends.sim.backend import SimBackend, modelled_batch_seconds
from hetero.backends.sim.detect import detect

__all__ = ["SimBackend", "detect", "modelled_batch_seconds"]
