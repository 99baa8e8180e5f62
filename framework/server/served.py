"""The stages a server answers with, and how one answered a request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetero.framework.policy.schema import StageConfig

__all__ = ["ServedStage", "StageRun"]


@dataclass(frozen=True, slots=True)
class ServedStage:
    """A policy stage the server answers with."""

    name: str
    kind: str
    config: StageConfig
    plugin: Any
    engine_stage: str | None = None  # the engine's stage of this version (default: name)

    @property
    def engine_name(self) -> str:
        """The engine stage this version runs as: the policy stage's name for the version
        the server started with, ``<name>@<model_version>`` for one swapped in since."""
        return self.engine_stage or self.name

    @property
    def sensitive(self) -> bool:
        """Whether the stage touches a data partition."""
        return self.config.partition is not None


@dataclass(frozen=True, slots=True)
class StageRun:
    """How a stage answered one request (reported to the client)."""

    stage: str
    device: str
    variant: str
    cached: bool = False
    reason: str = ""
    model_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        out: dict[str, Any] = {
            "stage": self.stage,
            "device": self.device,
            "variant": self.variant,
            "cached": self.cached,
        }
        if self.model_version:
            out["model_version"] = self.model_version
        if self.reason:
            out["degraded_because"] = self.reason
        return out
