"""Which model class runs a policy stage: by the stage's name, or by its ``model_version``
prefix, so a policy that names a stage ``id_card_ocr`` with ``model_version: pp-ocrv4@1`` is
served by the OCR model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetero.framework.policy.schema import StageConfig
from hetero.framework.registry import Registry

__all__ = ["KINDS", "MODEL_PREFIXES", "discover_stage_models", "stage_kind"]

KINDS = ("vision_encode", "ocr", "asr", "tts", "text_embed", "llm_generate")
MODEL_PREFIXES = {
    "efficientnet-lite0": "vision_encode",
    "pp-ocrv4": "ocr",
    "whisper-tiny.en": "asr",
    "piper-joe-medium": "tts",
    "all-minilm-l6-v2": "text_embed",
    "smollm2-135m-instruct": "llm_generate",
}
BATCHABLE = frozenset({"vision_encode", "text_embed"})


def stage_kind(name: str, config: StageConfig) -> str | None:
    """The model kind serving stage ``name``, or None when no built-in model fits."""
    base = config.model_version.split("@", 1)[0].lower()
    if base in MODEL_PREFIXES:
        return MODEL_PREFIXES[base]
    return name if name in KINDS else None


def discover_stage_models(registry: Registry) -> dict[str, Any]:
    """{kind: ModelStage class} from the ``stage_model`` plugins."""
    registry.load_plugins()
    found: Mapping[str, Any] = registry.extensions("stage_model")
    return {kind: cls for kind, cls in found.items() if kind in KINDS}
