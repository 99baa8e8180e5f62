"""The compliance gate the server asks before a sensitive stage runs, and after, to mask."""

from __future__ import annotations

from typing import Any, Protocol

from hetero.sandbox.access import Principal

__all__ = ["ComplianceGate", "SandboxProvider"]


class ComplianceGate(Protocol):
    """Access checks and field masking for stages that touch a data partition.

    ``authorize`` raises (any exception; its message is the reason the client sees with a 403)
    when ``principal`` may not run ``stage``; ``mask`` returns the stage's output as that
    principal may see it.
    """

    def authorize(self, principal: Principal, stage: str, request_id: str) -> None:
        """Raise when ``principal`` may not run ``stage`` for this request."""
        ...

    def mask(self, principal: Principal, stage: str, value: Any) -> Any:
        """``value`` with the fields ``principal`` may not see masked."""
        ...


class SandboxProvider(Protocol):
    """Gives the model class that runs a sensitive stage inside its partition's sandbox
    (``hetero.sandbox.serving.SandboxedStages``). ``model_class`` raises, saying what is
    missing, when the stage cannot be sandboxed here; the stage is then not served."""

    def model_class(self, stage: str, kind: str) -> type[Any]:
        """The sandboxed model class for ``stage`` (a model of ``kind``)."""
        ...
