"""Real small models that ship inside PyPI packages, one class per policy stage.

Importing this package is cheap: torch, transformers and the runtimes are imported inside the
methods that need them. Classes are resolved lazily on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetero.models.asr import SpeechRecognizer, Transcript
    from hetero.models.base import ModelStage
    from hetero.models.embed import TextEmbedder
    from hetero.models.llm import TextGenerator
    from hetero.models.ocr import OcrLine, OcrResult, TextReader
    from hetero.models.tts import Speech, SpeechSynthesizer
    from hetero.models.vision import VisionEncoder, VisionResult

__all__ = [
    "ModelStage",
    "OcrLine",
    "OcrResult",
    "Speech",
    "SpeechRecognizer",
    "SpeechSynthesizer",
    "TextEmbedder",
    "TextGenerator",
    "TextReader",
    "Transcript",
    "VisionEncoder",
    "VisionResult",
]

_WHERE = {
    "ModelStage": "base",
    "OcrLine": "ocr",
    "OcrResult": "ocr",
    "Speech": "tts",
    "SpeechRecognizer": "asr",
    "SpeechSynthesizer": "tts",
    "TextEmbedder": "embed",
    "TextGenerator": "llm",
    "TextReader": "ocr",
    "Transcript": "asr",
    "VisionEncoder": "vision",
    "VisionResult": "vision",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"hetero.models.{module}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
