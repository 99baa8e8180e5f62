"""What a stage's worker thread does with a batch: one model call per kind, results as plain
values (dicts, arrays, bytes), and one item's bad input never failing its batch neighbours."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetero.framework.server.workers import BatchCall

__all__ = ["Generation", "batch_call", "probe_payload"]


@dataclass(eq=False)
class Generation:
    """An LLM request; ``on_piece`` gets each streamed piece, ``stop`` ends generation early."""

    messages: Sequence[Mapping[str, str]]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    on_piece: Callable[[str], None] = lambda piece: None
    stop: threading.Event = field(default_factory=threading.Event)


def _each(function: Callable[[Any], Any], payloads: Sequence[Any]) -> list[Any]:
    results: list[Any] = []
    for payload in payloads:
        try:
            results.append(function(payload))
        except Exception as err:
            results.append(err)
    return results


def _vision(model: Any) -> BatchCall:
    def convert(result: Any) -> dict[str, Any]:
        return {
            "embedding": np.asarray(result.embedding, dtype=np.float32),
            "labels": [[str(name), float(score)] for name, score in result.labels],
            "width": int(result.width),
            "height": int(result.height),
        }

    def call(variant: str, images: Sequence[Any]) -> list[Any]:
        try:
            return [convert(r) for r in model.encode(list(images), variant=variant)]
        except Exception:
            if len(images) == 1:
                raise
        return _each(lambda image: convert(model.encode([image], variant=variant)[0]), images)

    return call


def _embed(model: Any) -> BatchCall:
    def call(variant: str, groups: Sequence[Any]) -> list[Any]:
        del variant
        flat = [text for group in groups for text in group]
        try:
            vectors = np.asarray(model.embed(flat), dtype=np.float32)
        except Exception:
            if len(groups) == 1:
                raise
            return _each(lambda group: np.asarray(model.embed(group), dtype=np.float32), groups)
        out, start = [], 0
        for group in groups:
            out.append(vectors[start : start + len(group)])
            start += len(group)
        return out

    return call


def _ocr(model: Any) -> BatchCall:
    def read(variant: str, image: bytes) -> dict[str, Any]:
        result = model.read(image, variant=variant)
        lines = [
            {
                "text": line.text,
                "confidence": float(line.confidence),
                "box": np.asarray(line.box, dtype=float).tolist(),
            }
            for line in result.lines
        ]
        return {"text": result.text, "lines": lines}

    return lambda variant, images: _each(lambda image: read(variant, image), images)


def _asr(model: Any) -> BatchCall:
    def transcribe(variant: str, audio: bytes) -> dict[str, Any]:
        t = model.transcribe(audio, variant=variant)
        return {"text": t.text, "duration_s": float(t.duration_s), "speech_s": float(t.speech_s)}

    return lambda variant, clips: _each(lambda clip: transcribe(variant, clip), clips)


def _tts(model: Any) -> BatchCall:
    def speak(request: tuple[str, float]) -> bytes:
        text, speed = request
        return bytes(model.synthesize(text, speed=speed).wav_bytes())

    return lambda variant, requests: _each(speak, requests)


def _llm(model: Any) -> BatchCall:
    def generate(job: Generation) -> dict[str, Any]:
        pieces: list[str] = []
        stream = model.generate(
            job.messages, max_tokens=job.max_tokens, temperature=job.temperature, seed=job.seed
        )
        stopped = False
        try:
            for piece in stream:
                if job.stop.is_set():
                    stopped = True
                    break
                pieces.append(piece)
                job.on_piece(piece)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        text = "".join(pieces)
        tokens = int(model.count_tokens(text)) if text else 0
        finish = "length" if tokens >= job.max_tokens else "stop"
        return {
            "text": text,
            "completion_tokens": tokens,
            "finish_reason": finish,
            "stopped": stopped,
        }

    return lambda variant, jobs: _each(generate, jobs)


_CALLS: dict[str, Callable[[Any], BatchCall]] = {
    "vision_encode": _vision,
    "text_embed": _embed,
    "ocr": _ocr,
    "asr": _asr,
    "tts": _tts,
    "llm_generate": _llm,
}


def batch_call(kind: str, model: Any) -> BatchCall:
    """The worker's call for a model of ``kind``."""
    return _CALLS[kind](model)


def probe_payload(kind: str) -> Any:
    """A small representative input, for timing runtimes at warm-up."""
    from hetero.framework.samples import photo_png, speech_like_wav

    if kind in ("vision_encode", "ocr"):
        return photo_png(seed=1)
    if kind == "asr":
        return speech_like_wav(1.0)
    if kind == "tts":
        return ("Hello.", 1.0)
    if kind == "text_embed":
        return ["A man is eating food.", "Someone is having a meal."]
    return Generation([{"role": "user", "content": "Say hi."}], max_tokens=4)
