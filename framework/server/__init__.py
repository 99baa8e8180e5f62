"""The HTTP API: OpenAI-compatible and modality routes over per-stage queues of real models.

``create_app(ServingRuntime(policy))`` builds the FastAPI app; ``hetero serve`` runs it on
uvicorn. See docs/serving.md.
"""

from hetero.framework.server.app import create_app
from hetero.framework.server.auth import Caller, KeyRing, hash_key
from hetero.framework.server.gate import ComplianceGate
from hetero.framework.server.runtime import ServingRuntime, StageRun

__all__ = [
    "Caller",
    "ComplianceGate",
    "KeyRing",
    "ServingRuntime",
    "StageRun",
    "create_app",
    "hash_key",
]
