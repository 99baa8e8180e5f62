"""The six-stage load of ``hetero bench serve --placement --load six``: one request per
stage of ``policies/bench-six.yaml`` through its one-step pipeline (``POST
/v1/pipelines/<name>``), mixed by share.

The shares favour the light stages, as a service's traffic would (embeddings and image tags
are asked for far more often than a transcript or a generation); every stage is asked often
enough at each concurrency to be measured. Content is a few fixed inputs per stage (the
bench turns the feature cache off, so repeats cost the same work): sentences to embed, the
serve bench's photos, a page of text to read, 2 s of speech-like audio, a sentence to speak
and a question with a 16-token answer budget.
"""

from __future__ import annotations

import base64
import functools
import json
import random
from collections.abc import Iterator
from typing import Any

from hetero.framework.bench.serve_mix import BenchRequest, base_images

__all__ = ["SIX_STAGE_POLICY", "SIX_STAGE_SHARES", "StageMix"]

SIX_STAGE_POLICY = "builtin:bench-six"
SIX_STAGE_SHARES = (
    ("embed", 0.30),
    ("vision", 0.25),
    ("ocr", 0.15),
    ("asr", 0.10),
    ("tts", 0.10),
    ("chat", 0.10),
)
CHAT_TOKENS = 16

_SENTENCES = (
    "The harbour bridge opens before the morning market.",
    "A quiet library keeps its maps in the basement.",
    "The violin teacher walks her dog along the river.",
    "Storm clouds gathered over the distant summit.",
)
_PAGE = ("Invoice 2041", "Total due: 318.40 EUR", "Pay before 30 June")


@functools.cache
def _bodies() -> dict[str, tuple[bytes, ...]]:
    """Request bodies per pipeline, made once per process."""
    from hetero.framework.samples import speech_like_wav, text_page_png

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    def body(inputs: dict[str, str], **extra: Any) -> bytes:
        return json.dumps({"inputs": inputs, **extra}).encode()

    return {
        "embed": tuple(body({"text": s}) for s in _SENTENCES),
        "vision": tuple(body({"image": b64(image)}) for image in base_images()),
        "ocr": (body({"image": b64(text_page_png(list(_PAGE)))}),),
        "asr": tuple(body({"audio": b64(speech_like_wav(2.0, seed=seed))}) for seed in (0, 1)),
        "tts": tuple(body({"text": s}) for s in _SENTENCES[:2]),
        "chat": (
            body(
                {"text": "Name a colour."},
                prompt="Answer in one short sentence.",
                max_tokens=CHAT_TOKENS,
            ),
        ),
    }


class StageMix:
    """A deterministic request stream per worker over the six pipelines (``SIX_STAGE_SHARES``).

    Every point of every stack is sent the same streams (the default ``seed``): a request here
    costs from about 10 ms (an embedding) to about a second (a generation), so with a new draw
    per point the number of generations and pages in a 20 s window alone moved a stack's
    figure by 10-30 % between rounds. With one draw, stacks differ by how fast they serve the
    same requests. The feature cache is off in the bench, so repeats cost the same work.

    Args:
        seed: Seeds the streams.
    """

    def __init__(self, seed: str = "six") -> None:
        self.seed = seed
        self.names = [name for name, _ in SIX_STAGE_SHARES]
        self.weights = [share for _, share in SIX_STAGE_SHARES]
        self.bodies = _bodies()

    def stream(self, worker: int) -> Iterator[BenchRequest]:
        """Requests of one worker, forever."""
        rng = random.Random(f"{self.seed}/{worker}")
        while True:
            (name,) = rng.choices(self.names, self.weights)
            body = rng.choice(self.bodies[name])
            yield BenchRequest(f"/v1/pipelines/{name}", {}, body)

    def routes(self) -> tuple[str, ...]:
        """Every route the stream sends to."""
        return tuple(f"/v1/pipelines/{name}" for name in self.names)
