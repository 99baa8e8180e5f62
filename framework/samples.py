"""Small generated inputs: photos-like images, rendered text pages and audio, for warm-up
timing, ``hetero demo`` and ``hetero bench serve`` (nothing is downloaded)."""

from __future__ import annotations

import io
import wave

import numpy as np

__all__ = ["photo_png", "speech_like_wav", "text_page_png"]


def photo_png(seed: int = 0, size: tuple[int, int] = (320, 240)) -> bytes:
    """A smooth random colour field with a few shapes, as PNG bytes (unique per seed)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    width, height = size
    ys, xs = np.mgrid[0:height, 0:width]
    base = rng.uniform(0, 255, 3)
    slope = rng.uniform(-0.5, 0.5, (3, 2))
    pixels = np.stack(
        [np.clip(base[c] + slope[c, 0] * xs + slope[c, 1] * ys, 0, 255) for c in range(3)], -1
    ).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, width - 40)), int(rng.integers(0, height - 40))
        x1, y1 = x0 + int(rng.integers(20, 120)), y0 + int(rng.integers(20, 120))
        fill = tuple(int(v) for v in rng.integers(0, 255, 3))
        draw.ellipse((x0, y0, x1, y1), fill=fill)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def text_page_png(lines: list[str], size: tuple[int, int] = (640, 320)) -> bytes:
    """Black text on white, as PNG bytes (for OCR)."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    try:
        font: ImageFont.FreeTypeFont | ImageFont.ImageFont = ImageFont.load_default(size=32)
    except TypeError:  # Pillow < 10.1 has no sized default font
        font = ImageFont.load_default()
    for index, line in enumerate(lines):
        draw.text((24, 24 + 48 * index), line, fill="black", font=font)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def speech_like_wav(seconds: float, sample_rate: int = 16000, seed: int = 0) -> bytes:
    """A voiced-sounding tone burst pattern as 16-bit mono WAV (not speech; for timing only)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 3 * t))
    signal = envelope * (np.sin(2 * np.pi * 180 * t) + 0.3 * np.sin(2 * np.pi * 360 * t))
    signal += 0.01 * rng.standard_normal(t.size)
    pcm = (np.clip(signal * 0.3, -1, 1) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(pcm.tobytes())
    return out.getvalue()
