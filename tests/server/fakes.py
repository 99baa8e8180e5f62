"""Fake stage plugins with the real stages' result shapes, for fast HTTP-layer tests.

They are NOT models: they load no graphs and compute nothing real. They still run through the
real engine (placement, lanes, admission, queues) on the real npu devices of this host.
"""

from __future__ import annotations

import io
import wave
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from hetero.framework.errors import InvalidInputError
from hetero.framework.graph import ComputeGraph, GraphFormat
from hetero.framework.stage_plugin import Generation, GraphRunner, StagePlugin


class _Fake(StagePlugin):
    name: ClassVar[str]

    def __init__(self, *, cache_dir: Any = None) -> None:
        self.calls = 0

    def graphs(
        self, variant: str = "full", graph_format: GraphFormat | None = None
    ) -> Mapping[str, ComputeGraph]:
        return {}

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        self.calls += 1
        results: list[Any] = []
        for payload in payloads:
            try:
                results.append(self.one(variant, payload))
            except Exception as err:
                results.append(err)
        return results

    def one(self, variant: str, payload: Any) -> Any:
        raise NotImplementedError


def _check_image(data: bytes) -> tuple[int, int]:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.size
    except Exception as err:
        raise InvalidInputError(f"image: cannot decode: {err}") from err


class FakeVision(_Fake):
    name = "vision_encode"
    batchable = True

    def one(self, variant: str, payload: Any) -> Any:
        width, height = _check_image(payload)
        return {
            "embedding": np.ones(1280, np.float32),
            "labels": [["tabby cat", 0.9]],
            "top1": 0,
            "width": width,
            "height": height,
        }


class FakeOcr(_Fake):
    name = "ocr"

    def one(self, variant: str, payload: Any) -> Any:
        _check_image(payload)
        box = [[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]
        return {"text": "HELLO", "lines": [{"text": "HELLO", "confidence": 0.99, "box": box}]}


class FakeAsr(_Fake):
    name = "asr"

    def one(self, variant: str, payload: Any) -> Any:
        try:
            with wave.open(io.BytesIO(payload)) as wav:
                seconds = wav.getnframes() / wav.getframerate()
        except Exception as err:
            raise InvalidInputError(f"audio: cannot decode: {err}") from err
        return {"text": "hello world", "duration_s": seconds, "speech_s": seconds}


class FakeTts(_Fake):
    name = "tts"

    def one(self, variant: str, payload: Any) -> Any:
        text, _speed = payload
        samples = np.zeros(int(16000 * 0.05 * len(text.split())), np.float32)
        out = io.BytesIO()
        with wave.open(out, "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(16000)
            wav.writeframes((samples * 32767).astype("<i2").tobytes())
        return out.getvalue()


class FakeEmbed(_Fake):
    name = "text_embed"
    batchable = True

    def items(self, payload: Any) -> int:
        return max(1, len(payload))

    def one(self, variant: str, payload: Any) -> Any:
        if not payload:
            raise InvalidInputError("no texts")
        out = np.zeros((len(payload), 384), np.float32)
        for row, text in enumerate(payload):
            for word in text.lower().split():
                out[row, zlib.crc32(word.encode()) % 384] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1, norms)

    def count_tokens(self, text: str) -> int:
        return len(text.split()) + 2


class FakeLlm(_Fake):
    name = "llm_generate"

    def one(self, variant: str, payload: Any) -> Any:
        job: Generation = payload
        words = ["The", " image", " shows", " a", " cat", "."] * 50
        limit = min(job.max_tokens, 16) if variant == "light" else job.max_tokens
        pieces = []
        stopped = False
        for word in words[:limit]:
            if job.stop.is_set():
                stopped = True
                break
            if word in job.stop_sequences:  # whole words only: enough for the HTTP layer
                limit = len(words)
                break
            pieces.append(word)
            job.on_piece(word)
        finish = "length" if len(pieces) >= limit else "stop"
        text = "".join(pieces)
        return {
            "text": text,
            "completion_tokens": len(pieces),
            "finish_reason": finish,
            "stopped": stopped,
        }

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def chat_prompt_tokens(self, messages: Sequence[Mapping[str, str]]) -> int:
        return len(self.chat_prompt_ids(messages))

    def chat_prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return list(range(sum(len(m.get("content", "").split()) + 4 for m in messages)))


FAKE_STAGES: dict[str, Any] = {
    cls.name: cls for cls in (FakeVision, FakeOcr, FakeAsr, FakeTts, FakeEmbed, FakeLlm)
}
