"""The request mix of ``hetero bench serve``: 70 % ``POST /embed`` of 1-4 sentences, 30 %
``POST /vision`` of one image of 68-223 KB, the peers harness's mix.

Content is unique per request unless it is meant to repeat: every sentence ends in words that
spell a hash of the run's nonce and a counter, and every image is one of four generated photos
(three JPEG, one PNG) with the nonce and counter written into a comment segment (JPEG ``COM``,
PNG ``tEXt``). The decoder skips
those bytes, so the model does the same work, but the feature cache, keyed by content, misses.
Generating fresh pixels per request would cost the load generator more CPU than the server spends
on the request, on the same two cores. With ``repeat_share`` > 0 that share of requests resends
an earlier request of the same worker, byte for byte.

The shapes of the stream (which route, how many sentences of what length, which photo, which
request repeats) depend only on the worker, not on the nonce: every stack and every round of a
run is measured on the same sequence of requests, so a point's figure does not move with the
share of slow vision requests its draw happened to hold (about 2 percentage points of share,
one sigma, over the ~450 requests of an 8 s point at concurrency 1).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import random
import secrets
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "EMBED_SHARE",
    "BenchRequest",
    "RequestMix",
    "base_images",
    "new_nonce",
    "unique_image",
]

EMBED_SHARE = 0.70
MAX_SENTENCES = 4
REPEAT_POOL = 64
TAG_WORDS = 6

_WORD_TEXT = (
    "a man woman child dog cat train river city market storm kitchen violin summit garden "
    "library museum bridge satellite coffee recipe harbour engine letter meeting forest "
    "is was will be runs reads plays builds crosses watches paints opens closes finds sells "
    "quickly slowly quietly before after during under over near across through beside "
    "red small old bright noisy empty crowded distant frozen golden heavy narrow"
)
_WORDS = _WORD_TEXT.split()

# (width, height, format, noise): about 68, 72, 113 and 223 KB, like the peers' four photos
_PHOTOS = (
    (560, 420, "JPEG", 7.0),
    (512, 512, "JPEG", 7.5),
    (720, 540, "JPEG", 8.0),
    (451, 300, "PNG", 4.0),
)


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request: the route, the body as sent and as a dict, and whether it repeats one."""

    route: str
    payload: dict[str, Any]
    body: bytes
    repeated: bool = False


def _photo(width: int, height: int, fmt: str, noise: float, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(40, 215, 3)
    slope = rng.uniform(-0.3, 0.3, (3, 2))
    channels = [
        base[c] + slope[c, 0] * xs + slope[c, 1] * ys + 40 * np.sin(xs / (7 + c) + ys / (11 + c))
        for c in range(3)
    ]
    pixels = np.stack(channels, -1) + rng.normal(0, noise, (height, width, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    out = io.BytesIO()
    if fmt == "JPEG":
        image.save(out, format="JPEG", quality=90)
    else:
        image.save(out, format="PNG")
    return out.getvalue()


@functools.cache
def base_images() -> tuple[bytes, ...]:
    """The four generated photos (made once per process, deterministic)."""
    return tuple(_photo(w, h, fmt, noise, seed) for seed, (w, h, fmt, noise) in enumerate(_PHOTOS))


def new_nonce() -> str:
    """A run's nonce."""
    return f"{secrets.randbelow(10**6):06d}"


def unique_image(image: bytes, tag: str) -> bytes:
    """``image`` with ``tag`` in a comment segment: other bytes, the same pixels."""
    text = tag.encode("ascii")
    if image[:2] == b"\xff\xd8":  # JPEG: a COM segment right after SOI
        return image[:2] + b"\xff\xfe" + struct.pack(">H", len(text) + 2) + text + image[2:]
    if image[:8] == b"\x89PNG\r\n\x1a\n":  # PNG: a tEXt chunk right after IHDR (8 + 25 bytes)
        data = b"Comment\x00" + text
        chunk = b"tEXt" + data
        packed = struct.pack(">I", len(data)) + chunk + struct.pack(">I", zlib.crc32(chunk))
        return image[:33] + packed + image[33:]
    raise ValueError("unique_image() takes JPEG or PNG bytes")


class RequestMix:
    """A deterministic request stream per worker (the same shapes in every run), unique
    content per run (nonce).

    Args:
        nonce: Differs between runs, so no run hits what another one cached.
        repeat_share: The share of requests that resend one of this worker's earlier ones.
        embed_share: The share of ``/embed`` requests; the rest are ``/vision``.
    """

    def __init__(
        self, nonce: str, repeat_share: float = 0.0, embed_share: float = EMBED_SHARE
    ) -> None:
        if not 0.0 <= repeat_share < 1.0:
            raise ValueError(f"repeat_share must be in [0, 1), got {repeat_share}")
        if not 0.0 <= embed_share <= 1.0:
            raise ValueError(f"embed_share must be in [0, 1], got {embed_share}")
        self.nonce = nonce
        self.repeat_share = repeat_share
        self.embed_share = embed_share
        self.images = base_images()

    def stream(self, worker: int) -> Iterator[BenchRequest]:
        """Requests of one worker, forever."""
        rng = random.Random(f"mix/{worker}")  # the same shapes in every run (module doc)
        sent: list[BenchRequest] = []
        for counter in range(1 << 62):
            if sent and rng.random() < self.repeat_share:
                earlier = rng.choice(sent)
                yield BenchRequest(earlier.route, earlier.payload, earlier.body, repeated=True)
                continue
            tag = f"{self.nonce}-{worker}-{counter}"
            if rng.random() < self.embed_share:
                count = rng.randint(1, MAX_SENTENCES)
                texts = [_sentence(rng, f"{tag}.{i}") for i in range(count)]
                payload: dict[str, Any] = {"texts": texts}
                request = BenchRequest("/embed", payload, json.dumps(payload).encode())
            else:
                image = unique_image(rng.choice(self.images), tag)
                encoded = base64.b64encode(image).decode("ascii")
                payload = {"image_b64": encoded}
                body = b'{"image_b64": "' + encoded.encode("ascii") + b'"}'
                request = BenchRequest("/vision", payload, body)
            sent.append(request)
            if len(sent) > REPEAT_POOL:
                sent.pop(0)
            yield request
        raise AssertionError("unreachable")


def _sentence(rng: random.Random, tag: str) -> str:
    """Random words, then six words spelling a hash of ``tag``: unique, but few tokens (digits
    and hex split into many word pieces), about as long as the peers' sentences."""
    words = [rng.choice(_WORDS) for _ in range(rng.randint(2, 9))]
    code = int.from_bytes(hashlib.blake2b(tag.encode(), digest_size=8).digest(), "big")
    for _ in range(TAG_WORDS):
        code, index = divmod(code, len(_WORDS))
        words.append(_WORDS[index])
    return f"{' '.join(words).capitalize()}."
