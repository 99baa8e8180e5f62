"""Small fake model stages with the real stages' shapes, for fast HTTP-layer tests."""

from __future__ import annotations

import io
import wave
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from hetero.framework.errors import InvalidInputError


class _Fake:
    name: ClassVar[str]
    runtimes: ClassVar[tuple[str, ...]] = ("onnxruntime",)

    def __init__(self, *, runtime: str = "onnxruntime", cache_dir: Any = None, threads: int = 1):
        self.runtime = runtime
        self._loaded = False
        self.calls = 0

    def prepare(self) -> None:
        pass

    def load(self) -> None:
        self._loaded = True

    @property
    def loaded(self) -> bool:
        return self._loaded

    def close(self) -> None:
        self._loaded = False


def _check_image(data: bytes) -> tuple[int, int]:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.size
    except Exception as err:
        raise InvalidInputError(f"image: cannot decode: {err}") from err


@dataclass
class VisionResult:
    embedding: np.ndarray
    labels: tuple[tuple[str, float], ...]
    width: int
    height: int


class FakeVision(_Fake):
    name = "vision_encode"
    runtimes = ("onnxruntime", "openvino")
    _labels: ClassVar[list[str]] = ["tabby cat", "espresso"]

    def encode(self, images: Sequence[bytes], variant: str = "full") -> list[VisionResult]:
        self.calls += 1
        out = []
        for data in images:
            width, height = _check_image(data)
            out.append(
                VisionResult(np.ones(1280, np.float32), (("tabby cat", 0.9),), width, height)
            )
        return out


@dataclass
class OcrLine:
    text: str
    confidence: float
    box: tuple[tuple[float, float], ...]


@dataclass
class OcrResult:
    text: str
    lines: tuple[OcrLine, ...]


class FakeOcr(_Fake):
    name = "ocr"

    def read(self, image: bytes, variant: str = "full") -> OcrResult:
        _check_image(image)
        line = OcrLine("HELLO", 0.99, ((0, 0), (1, 0), (1, 1), (0, 1)))
        return OcrResult("HELLO", (line,))


@dataclass
class Transcript:
    text: str
    duration_s: float
    speech_s: float


class FakeAsr(_Fake):
    name = "asr"

    def transcribe(self, audio: bytes, variant: str = "full") -> Transcript:
        try:
            with wave.open(io.BytesIO(audio)) as wav:
                seconds = wav.getnframes() / wav.getframerate()
        except Exception as err:
            raise InvalidInputError(f"audio: cannot decode: {err}") from err
        return Transcript("hello world", seconds, seconds)


@dataclass
class Speech:
    samples: np.ndarray
    sample_rate: int

    def wav_bytes(self) -> bytes:
        out = io.BytesIO()
        with wave.open(out, "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(self.sample_rate)
            wav.writeframes((self.samples * 32767).astype("<i2").tobytes())
        return out.getvalue()


class FakeTts(_Fake):
    name = "tts"

    def synthesize(self, text: str, *, speed: float = 1.0) -> Speech:
        return Speech(np.zeros(int(16000 * 0.05 * len(text.split())), np.float32), 16000)


class FakeEmbed(_Fake):
    name = "text_embed"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            raise InvalidInputError("no texts")
        out = np.zeros((len(texts), 384), np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, hash(word) % 384] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1, norms)

    def count_tokens(self, text: str) -> int:
        return len(text.split()) + 2


class FakeLlm(_Fake):
    name = "llm_generate"

    def generate(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> Iterator[str]:
        words = ["The", " image", " shows", " a", " cat", "."] * 50
        yield from words[:max_tokens]

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def chat_prompt_tokens(self, messages: Sequence[Mapping[str, str]]) -> int:
        return sum(len(m.get("content", "").split()) + 4 for m in messages)


FAKE_STAGES: dict[str, Any] = {
    cls.name: cls for cls in (FakeVision, FakeOcr, FakeAsr, FakeTts, FakeEmbed, FakeLlm)
}
