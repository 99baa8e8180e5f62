"""Real models, loaded once per session; inputs are generated on the spot (no fixture files).

Derived artefacts go to the model cache (``$HETERO_MODEL_CACHE`` or ~/.cache/hetero/models), so
only the first run pays for the ONNX exports and the GGUF conversion.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from hetero.models.asr import SpeechRecognizer
from hetero.models.assets import model_cache_dir
from hetero.models.base import ModelStage
from hetero.models.embed import TextEmbedder
from hetero.models.llm import TextGenerator
from hetero.models.ocr import TextReader
from hetero.models.tts import SpeechSynthesizer
from hetero.models.vision import VisionEncoder

SENTENCE = "The quick brown fox jumps over the lazy dog."
S = TypeVar("S", bound=ModelStage)


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return model_cache_dir()


def _loaded(stage: S) -> Iterator[S]:
    stage.load()
    yield stage
    stage.close()


@pytest.fixture(scope="session")
def vision(cache_dir: Path) -> Iterator[VisionEncoder]:
    yield from _loaded(VisionEncoder(runtime="onnxruntime", cache_dir=cache_dir, threads=2))


@pytest.fixture(scope="session")
def vision_ov(cache_dir: Path) -> Iterator[VisionEncoder]:
    yield from _loaded(VisionEncoder(runtime="openvino", cache_dir=cache_dir, threads=2))


@pytest.fixture(scope="session")
def embedder(cache_dir: Path) -> Iterator[TextEmbedder]:
    yield from _loaded(TextEmbedder(runtime="onnxruntime", cache_dir=cache_dir, threads=2))


@pytest.fixture(scope="session")
def embedder_ov(cache_dir: Path) -> Iterator[TextEmbedder]:
    yield from _loaded(TextEmbedder(runtime="openvino", cache_dir=cache_dir, threads=2))


@pytest.fixture(scope="session")
def reader(cache_dir: Path) -> Iterator[TextReader]:
    yield from _loaded(TextReader(runtime="onnxruntime", cache_dir=cache_dir, threads=2))


@pytest.fixture(scope="session")
def synthesizer(cache_dir: Path) -> Iterator[SpeechSynthesizer]:
    yield from _loaded(SpeechSynthesizer(runtime="onnxruntime", cache_dir=cache_dir, threads=2))


@pytest.fixture(scope="session")
def recognizer(cache_dir: Path) -> Iterator[SpeechRecognizer]:
    yield from _loaded(SpeechRecognizer(runtime="onnxruntime", cache_dir=cache_dir, threads=2))


@pytest.fixture(scope="session")
def generator(cache_dir: Path) -> Iterator[TextGenerator]:
    yield from _loaded(TextGenerator(runtime="torch", cache_dir=cache_dir, threads=2))


@pytest.fixture(scope="session")
def sentence_wav(synthesizer: SpeechSynthesizer) -> bytes:
    """Piper speaking :data:`SENTENCE`, noise off, as a 22.05 kHz WAV file."""
    return synthesizer.synthesize(SENTENCE, deterministic=True).wav_bytes()


def _png(image: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")  # type: ignore[attr-defined]
    return buffer.getvalue()


@pytest.fixture(scope="session")
def crossword_png() -> bytes:
    """A crossword grid: EfficientNet-Lite0 calls it ``crossword`` with ~0.9 probability."""
    return _crossword(300, seed=0)


def _crossword(size: int, seed: int) -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    rng = np.random.default_rng(seed)
    cells = 15
    step = size / cells
    for i in range(cells):
        for j in range(cells):
            fill = "black" if rng.random() < 0.2 else "white"
            box = (i * step, j * step, (i + 1) * step, (j + 1) * step)
            draw.rectangle(box, fill=fill, outline="black", width=2)
    return _png(image)


@pytest.fixture(scope="session")
def render_text() -> Callable[..., bytes]:
    """``render_text(lines, width=700, font_size=40)``: PNG bytes of the lines."""
    return _text_png


def _text_png(lines: list[str], width: int = 700, font_size: int = 40) -> bytes:
    """Black text on white in Pillow's bundled font (no system fonts needed)."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=font_size)
    image = Image.new("RGB", (width, 60 + 80 * len(lines)), "white")
    draw = ImageDraw.Draw(image)
    for index, line in enumerate(lines):
        draw.text((30, 40 + 80 * index), line, fill="black", font=font)
    return _png(image)
