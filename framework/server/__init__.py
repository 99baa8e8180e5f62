"""The HTTP API: OpenAI-compatible and modality routes over the engine's stages.

``create_app(Serving(policy))`` builds the FastAPI app; ``hetero serve`` runs it on uvicorn.
See docs/serving.md and docs/architecture.md.
"""

from hetero.framework.server.app import create_app
from hetero.framework.server.auth import Caller, KeyRing, hash_key
from hetero.framework.server.served import StageRun
from hetero.framework.server.serving import Serving

__all__ = [
    "Caller",
    "KeyRing",
    "Serving",
    "StageRun",
    "create_app",
    "hash_key",
]
