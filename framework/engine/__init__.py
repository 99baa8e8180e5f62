"""The engine: pipelines on real devices, with admission, scheduling, retries and metrics."""

from hetero.framework.engine.engine import (
    AccessGate,
    AccessRefusedError,
    Engine,
    StageStatus,
    describe_failure,
)
from hetero.framework.engine.metrics import Metrics
from hetero.framework.engine.request_graph import FeatureStore, GraphNode, RequestGraph
from hetero.framework.engine.requests import EngineResult, StepTrace

__all__ = [
    "AccessGate",
    "AccessRefusedError",
    "Engine",
    "EngineResult",
    "FeatureStore",
    "GraphNode",
    "Metrics",
    "RequestGraph",
    "StageStatus",
    "StepTrace",
    "describe_failure",
]
