"""Values to bytes and back, without pickle: numpy arrays and JSON-able results.

Layout: ``b"HFC2"`` | kind (``N`` array, ``D`` named arrays, ``M`` a mapping of arrays and
JSON-able values, ``J`` JSON) | XXH3-64 of the body | body. XXH3 (the ``xxhash`` binding, BSD)
checks 5 KB in 0.41 us here against zlib's CRC32's 4.2 us, measured side by side; entries
written before it (``b"HFC1"``, CRC32) still decode. An array body is its dtype string, its
shape and its raw bytes (C order); object and structured dtypes are refused. Named arrays (a
stage's outputs) are a JSON list of names and lengths followed by each array's own encoding. A
mixed mapping (a vision result: a float32 embedding beside labels and sizes) is a JSON list of
its keys in order and of its other values, followed by its arrays as named arrays: its arrays
keep their dtype and bytes and cost no JSON (a 1,280-float embedding as JSON was 25 KB and 1.5
ms of CPU to encode and decode, against 5 KB and microseconds). A checksum that does not match,
or bytes that do not parse, raise :class:`CorruptEntryError`.
"""

from __future__ import annotations

import functools
import json
import math
import struct
import zlib
from typing import Any

import numpy as np
import xxhash

from hetero.framework.errors import CacheValueError, CorruptEntryError

__all__ = ["decode", "decode_from", "encode"]

MAGIC = b"HFC2"
MAGIC_CRC32 = b"HFC1"  # the layout before XXH3: read, never written
_HEADER = struct.Struct("<4scQ")
_HEADER_CRC32 = struct.Struct("<4scI")
_checksum = xxhash.xxh3_64_intdigest


def _named(arrays: dict[str, Any]) -> bytes:
    """Named arrays' body: the JSON index of names and lengths, then each array's encoding."""
    parts = [(str(name), encode(array)) for name, array in arrays.items()]
    index = json.dumps([[name, len(blob)] for name, blob in parts]).encode()
    return struct.pack("<I", len(index)) + index + b"".join(b for _, b in parts)


def _json(value: Any) -> bytes:
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as err:
        raise CacheValueError(type(value).__name__, str(err)) from err


def encode(value: Any) -> bytes:
    """Serialise a numpy array, a mapping of names to arrays, a mapping of string keys to
    arrays and JSON-able values, or a JSON-able value."""
    if isinstance(value, dict) and value:
        arrays = {k: v for k, v in value.items() if isinstance(v, np.ndarray)}
        if len(arrays) == len(value):
            named = _named(arrays)
            return _HEADER.pack(MAGIC, b"D", _checksum(named)) + named
        if arrays and all(isinstance(k, str) for k in value):
            rest = _json([list(value), {k: v for k, v in value.items() if k not in arrays}])
            mixed = struct.pack("<I", len(rest)) + rest + _named(arrays)
            return _HEADER.pack(MAGIC, b"M", _checksum(mixed)) + mixed
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:  # pickle would be needed: refused
            raise CacheValueError("numpy array of objects")
        if value.dtype.fields is not None:
            raise CacheValueError("structured numpy array", "its field names would be lost")
        dtype = value.dtype.str.encode()
        array = np.require(value, requirements="C")
        body: bytes = (
            struct.pack("<B", len(dtype))
            + dtype
            + struct.pack("<B", array.ndim)
            + struct.pack(f"<{array.ndim}Q", *array.shape)
            + array.tobytes()
        )
        kind = b"N"
    else:
        body = _json(value)
        kind = b"J"
    return _HEADER.pack(MAGIC, kind, _checksum(body)) + body


@functools.lru_cache(maxsize=64)
def _dtype(spelled: bytes) -> np.dtype[Any]:
    dtype = np.dtype(spelled.decode())
    if dtype.hasobject:
        raise ValueError("object dtype")
    return dtype


_ndarray = np.ndarray
_SHAPES = [struct.Struct(f"<{ndim}Q").unpack_from for ndim in range(65)]  # numpy 2's most
BODY = _HEADER.size  # where the body starts
_ARRAY = MAGIC + b"N"
_STORED_CHECKSUM = struct.Struct("<5xQ").unpack_from
LAYOUTS_KEPT = 256  # array layouts kept, at most
# Arrays decoded before, by the entry's length: (the array header's exact bytes, where the
# array's bytes start, shape, dtype). A cache's values share a few layouts.
_LAYOUTS: dict[int, tuple[bytes, int, tuple[int, ...], np.dtype[Any]]] = {}


def decode(blob: bytes, tier: str = "cache", *, verified: bool = False) -> Any:
    """The value :func:`encode` serialised; :class:`CorruptEntryError` for anything else.
    ``verified`` skips the checksum, for bytes this process has just encoded itself.

    An array of a length decoded before whose header (dtype and shape) is byte for byte the
    one seen then has that layout: two prefix comparisons, the checksum and the array, no
    parsing (the header's bytes decide the dtype, the shape and so where the array starts).
    """
    layout = _LAYOUTS.get(len(blob))
    if layout is not None:
        head, offset, shape, dtype = layout
        if blob.startswith(head, BODY) and blob.startswith(_ARRAY):
            if not verified and _checksum(memoryview(blob)[BODY:]) != _STORED_CHECKSUM(blob)[0]:
                raise CorruptEntryError(tier, "checksum mismatch")
            # Read-only and shared with the cached bytes: callers get a view, never a copy.
            # (np.ndarray over the buffer, positional: half np.frombuffer's cost here.)
            return _ndarray(shape, dtype, blob, offset)
    return _decode(blob, tier, verified)


def decode_from(record: bytes, start: int, tier: str = "cache") -> Any:
    """:func:`decode` of the value that starts at ``start`` in ``record`` (a lower tier's whole
    record, its own header before the value), checksum verified, without copying the value out:
    an array is a read-only view into ``record`` (which it keeps alive), as :func:`decode`'s is
    into its bytes. A layout not seen before, and JSON, go through :func:`decode` of a copy."""
    layout = _LAYOUTS.get(len(record) - start)
    if layout is not None:
        head, offset, shape, dtype = layout
        if record.startswith(head, start + BODY) and record.startswith(_ARRAY, start):
            if _checksum(memoryview(record)[start + BODY :]) != _STORED_CHECKSUM(record, start)[0]:
                raise CorruptEntryError(tier, "checksum mismatch")
            return _ndarray(shape, dtype, record, start + offset)
    return decode(record[start:] if start else record, tier)


def _decode(blob: bytes, tier: str, verified: bool) -> Any:
    """:func:`decode`'s general path: every kind and layout, the one before XXH3 too."""
    if len(blob) >= _HEADER.size and blob.startswith(MAGIC):
        _, kind, checksum = _HEADER.unpack_from(blob)
        start = _HEADER.size
        if not verified and _checksum(memoryview(blob)[start:]) != checksum:
            raise CorruptEntryError(tier, "checksum mismatch")
    elif len(blob) >= _HEADER_CRC32.size and blob.startswith(MAGIC_CRC32):
        _, kind, checksum = _HEADER_CRC32.unpack_from(blob)
        start = _HEADER_CRC32.size
        if zlib.crc32(memoryview(blob)[start:]) != checksum:
            raise CorruptEntryError(tier, "checksum mismatch")
    elif len(blob) < _HEADER.size:
        raise CorruptEntryError(tier, "too short")
    else:
        raise CorruptEntryError(tier, "bad magic")
    try:
        if kind == b"N":
            dtype_end = start + 1 + blob[start]
            ndim = blob[dtype_end]
            offset = dtype_end + 1 + 8 * ndim
            dtype = _dtype(blob[start + 1 : dtype_end])
            shape = _SHAPES[ndim](blob, dtype_end + 1)
            if len(blob) - offset != dtype.itemsize * math.prod(shape):
                raise ValueError("the array's bytes do not match its shape")
            if start == BODY:  # this layout's entries take decode's short path from now on
                if len(_LAYOUTS) >= LAYOUTS_KEPT:
                    _LAYOUTS.clear()
                _LAYOUTS[len(blob)] = (bytes(blob[start:offset]), offset, shape, dtype)
            return _ndarray(shape, dtype, blob, offset)
        if kind == b"J":
            return json.loads(blob[start:])
        if kind == b"D":
            return _decode_named(blob, start, tier)
        if kind == b"M":
            (rest_len,) = struct.unpack_from("<I", blob, start)
            order, rest = json.loads(blob[start + 4 : start + 4 + rest_len])
            arrays = _decode_named(blob, start + 4 + rest_len, tier)
            return {key: arrays[key] if key in arrays else rest[key] for key in order}
    except (ValueError, TypeError, IndexError, KeyError, struct.error, UnicodeDecodeError) as err:
        raise CorruptEntryError(tier, str(err)) from err
    raise CorruptEntryError(tier, f"unknown kind {kind!r}")


def _decode_named(blob: bytes, start: int, tier: str) -> dict[str, Any]:
    (index_len,) = struct.unpack_from("<I", blob, start)
    offset = start + 4 + index_len
    named = {}
    for name, length in json.loads(blob[start + 4 : offset]):
        part = blob[offset : offset + int(length)]
        named[str(name)] = decode(part, tier, verified=True)
        offset += int(length)
    if offset != len(blob):
        raise ValueError("the named arrays do not fill the entry")
    return named
