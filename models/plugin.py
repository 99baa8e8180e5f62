"""Entry point ``hetero.plugins: models``: registers each model stage as a ``stage_model``."""

from __future__ import annotations

from typing import Any

__all__ = ["STAGE_MODELS", "register"]

STAGE_MODELS = (
    "hetero.models.vision:VisionEncoder",
    "hetero.models.ocr:TextReader",
    "hetero.models.asr:SpeechRecognizer",
    "hetero.models.tts:SpeechSynthesizer",
    "hetero.models.embed:TextEmbedder",
    "hetero.models.llm:TextGenerator",
)


def register(registry: Any) -> None:
    """Add every stage class under its policy stage name (kind ``stage_model``).

    The stage modules import only numpy and hetero at module level, so this stays cheap.
    """
    import importlib

    for target in STAGE_MODELS:
        module, _, attribute = target.partition(":")
        cls = getattr(importlib.import_module(module), attribute)
        registry.register("stage_model", cls.name, cls)
