"""The sim backend is always available: it needs no hardware."""

from __future__ import annotations

from hetero.framework.registry import Detection

PRIORITY = -20  # never preferred over real hardware


def detect() -> Detection:
    """Available; its devices come from ``HETERO_SIM_POLICY`` (default: the mixed fleet)."""
    from hetero.backends.sim.backend import SimBackend

    return Detection.found(
        "sim", SimBackend.from_env, reason="simulated devices", priority=PRIORITY, simulated=True
    )
