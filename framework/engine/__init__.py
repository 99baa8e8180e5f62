"""The engine: pipelines on real devices, with admission, scheduling, retries and metrics."""

from hetero.framework.engine.engine import AccessGate, AccessRefusedError, Engine
from hetero.framework.engine.requests import EngineResult

__all__ = ["AccessGate", "AccessRefusedError", "Engine", "EngineResult"]
