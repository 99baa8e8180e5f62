"""The engine: pipelines on real devices, with admission, scheduling, retries and metrics."""

from hetero.framework.engine.engine import (
    AccessGate,
    AccessRefusedError,
    Engine,
    StageStatus,
    describe_failure,
)
from hetero.framework.engine.metrics import Metrics
from hetero.framework.engine.requests import EngineResult, StepTrace

__all__ = [
    "AccessGate",
    "AccessRefusedError",
    "Engine",
    "EngineResult",
    "Metrics",
    "StageStatus",
    "StepTrace",
    "describe_failure",
]
