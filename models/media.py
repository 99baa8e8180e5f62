"""Decoding request bytes into arrays, with undecodable input reported as InvalidInputError."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np

from hetero.framework.errors import InvalidInputError

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["decode_audio", "decode_image", "resample"]

MAX_IMAGE_PIXELS = 64_000_000
MAX_AUDIO_SECONDS = 3600.0


def decode_image(data: bytes, what: str = "image") -> Image.Image:
    """Decode PNG/JPEG/... bytes into an RGB PIL image.

    Raises:
        InvalidInputError: Empty, truncated or unknown bytes, or an image over 64 Mpixel.
    """
    if not data:
        raise InvalidInputError(f"{what}: empty bytes")
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as opened:
            if opened.width * opened.height > MAX_IMAGE_PIXELS:
                raise InvalidInputError(
                    f"{what}: {opened.width}x{opened.height} is over {MAX_IMAGE_PIXELS} pixels"
                )
            image = opened.convert("RGB")
    except InvalidInputError:
        raise
    except Exception as err:  # PIL raises a zoo of types for bad bytes
        raise InvalidInputError(f"{what}: cannot decode image ({err})") from err
    if image.width < 1 or image.height < 1:
        raise InvalidInputError(f"{what}: image has no pixels")
    return image


def decode_audio(data: bytes, what: str = "audio") -> tuple[np.ndarray, int]:
    """Decode WAV/FLAC/OGG bytes into mono float32 samples and their sample rate.

    Raises:
        InvalidInputError: Empty or undecodable bytes, no samples, or over an hour long.
    """
    if not data:
        raise InvalidInputError(f"{what}: empty bytes")
    import soundfile

    try:
        with soundfile.SoundFile(io.BytesIO(data)) as sound:
            rate = int(sound.samplerate)
            if sound.frames > MAX_AUDIO_SECONDS * rate:
                raise InvalidInputError(f"{what}: longer than {MAX_AUDIO_SECONDS:.0f} s")
            frames = sound.read(dtype="float32", always_2d=True)
    except InvalidInputError:
        raise
    except Exception as err:  # soundfile raises LibsndfileError, RuntimeError, TypeError...
        raise InvalidInputError(f"{what}: cannot decode audio ({err})") from err
    if frames.shape[0] == 0 or rate <= 0:
        raise InvalidInputError(f"{what}: no samples")
    samples = frames.mean(axis=1, dtype=np.float32)
    if not np.all(np.isfinite(samples)):
        raise InvalidInputError(f"{what}: samples are not finite")
    return samples, rate


def resample(samples: np.ndarray, rate: int, target_rate: int) -> np.ndarray:
    """Band-limited resampling through the FFT (exact up to edge effects; no scipy)."""
    samples = np.asarray(samples, dtype=np.float32)
    if rate == target_rate or samples.size == 0:
        return samples
    n_in = samples.shape[0]
    n_out = max(1, round(n_in * target_rate / rate))
    spectrum = np.fft.rfft(samples.astype(np.float64))
    bins = n_out // 2 + 1
    if bins <= spectrum.shape[0]:
        spectrum = spectrum[:bins]
    else:
        spectrum = np.concatenate([spectrum, np.zeros(bins - spectrum.shape[0], spectrum.dtype)])
    out: np.ndarray = np.fft.irfft(spectrum, n_out) * (n_out / n_in)
    return out.astype(np.float32)
