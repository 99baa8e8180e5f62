"""A ``hetero.plugins`` entry point: registers one stage factory, to test plugin loading."""

from __future__ import annotations

from typing import Any


def echo_stage() -> str:
    """A stand-in stage factory."""
    return "echo"


def register(registry: Any) -> None:
    """Add the dummy stage to ``registry``."""
    registry.register("stage", "dummy_echo", echo_stage)
