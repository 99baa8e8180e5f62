"""Request media: data URLs and base64, checked against the policy's limits before any model
sees them, with messages that name the field."""

from __future__ import annotations

import base64
import binascii
import io
import re
import struct

from hetero.framework.policy.schema import ServerLimits
from hetero.framework.server.errors import APIError, invalid_input

__all__ = ["audio_seconds", "decode_base64", "decode_data_url", "image_size"]


def decode_base64(text: str, param: str) -> bytes:
    """Bytes of a base64 field (a data URL is accepted too)."""
    if text.startswith("data:"):
        return decode_data_url(text, param)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_input(f"{param}: not valid base64", param) from None
    if not data:
        raise invalid_input(f"{param}: empty", param)
    return data


def decode_data_url(url: str, param: str) -> bytes:
    """Bytes of a ``data:<type>;base64,<data>`` URL; other URLs are refused (no fetching)."""
    if not url.startswith("data:"):
        raise invalid_input(
            f"{param}: only data: URLs are supported (data:image/png;base64,...); "
            "the server does not fetch remote URLs",
            param,
            "unsupported_url",
        )
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise invalid_input(
            f"{param}: expected a base64 data URL (data:<type>;base64,<data>)", param
        )
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_input(f"{param}: the data URL's payload is not valid base64", param) from None
    if not data:
        raise invalid_input(f"{param}: the data URL is empty", param)
    return data


def _check_wav_chunks(data: bytes, param: str) -> None:
    """400 when a RIFF/WAVE file's chunks claim more bytes than it holds (a header that says 4
    GiB on a few kilobytes: the decoder would read what is there and answer for audio that
    was never sent)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return
    claimed = struct.unpack_from("<I", data, 4)[0] + 8
    if claimed > len(data):
        raise invalid_input(
            f"{param}: the WAV header claims {claimed} bytes, the file holds {len(data)}",
            param,
            "invalid_audio",
        )
    at, end = 12, claimed  # bytes after the RIFF chunk are not its chunks
    while at + 8 <= end:
        chunk, size = data[at : at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if at + 8 + size > len(data):
            name = chunk.decode("latin-1").strip()
            raise invalid_input(
                f"{param}: the WAV {name!r} chunk claims {size} bytes, "
                f"{len(data) - at - 8} follow it",
                param,
                "invalid_audio",
            )
        at += 8 + size + (size & 1)


def image_size(data: bytes, limits: ServerLimits, param: str) -> tuple[int, int]:
    """(width, height) from the image header; 400 when it is not an image or too large."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Image.DecompressionBombError as err:  # Pillow's own ceiling, far above ours
        found = re.search(r"\((\d+) pixels\)", str(err))
        size = f"{int(found.group(1))} pixels" if found else "its size"
        raise APIError(
            400,
            f"{param}: {size} is over the limit of {limits.max_image_pixels} pixels",
            param=param,
            code="image_too_large",
        ) from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise invalid_input(
            f"{param}: not a decodable image (PNG, JPEG, WebP, ...)", param, "invalid_image"
        ) from None
    if width * height > limits.max_image_pixels:
        raise APIError(
            400,
            f"{param}: {width}x{height} is over the limit of {limits.max_image_pixels} pixels",
            param=param,
            code="image_too_large",
        )
    return width, height


def audio_seconds(data: bytes, limits: ServerLimits, param: str) -> float:
    """Duration of an audio file; 400 when it is not audio, its WAV header claims more than
    the file holds, or it is too long."""
    import soundfile

    _check_wav_chunks(data, param)

    try:
        info = soundfile.info(io.BytesIO(data))
        seconds = float(info.frames) / float(info.samplerate)
    except Exception:  # libsndfile raises its own error types, and some bytes crash its sniffing
        raise invalid_input(
            f"{param}: not a decodable audio file (WAV, FLAC, OGG, MP3)", param, "invalid_audio"
        ) from None
    if seconds <= 0:
        raise invalid_input(f"{param}: the audio is empty", param, "invalid_audio")
    if seconds > limits.max_audio_seconds:
        raise APIError(
            400,
            f"{param}: {seconds:.1f} s of audio is over the limit of "
            f"{limits.max_audio_seconds:g} s",
            param=param,
            code="audio_too_long",
        )
    return seconds
