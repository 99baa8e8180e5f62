"""The engine: pipelines on real devices, with admission, scheduling, retries and metrics."""

from hetero.framework.engine.engine import Engine
from hetero.framework.engine.requests import EngineResult

__all__ = ["Engine", "EngineResult"]
