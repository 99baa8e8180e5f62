"""The cache codec's checksum: XXH3 over the body; the CRC32 layout before it still reads."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from hetero.cache.codec import decode, encode
from hetero.framework.errors import CacheValueError, CorruptEntryError


def test_a_round_trip_keeps_dtype_shape_and_bytes() -> None:
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    back = decode(encode(value))
    assert back.dtype == value.dtype and back.shape == (3, 4)
    assert np.array_equal(back, value)
    assert decode(encode({"text": "a", "n": [1, 2]})) == {"text": "a", "n": [1, 2]}


@pytest.mark.parametrize("position", [-1, 20, 8])  # the last byte, a body byte, the checksum field
def test_one_flipped_byte_is_a_corrupt_entry(position: int) -> None:
    blob = bytearray(encode(np.ones(64, np.float32)))
    blob[position] ^= 0x01
    with pytest.raises(CorruptEntryError, match="checksum mismatch"):
        decode(bytes(blob), "disk")


def test_verified_skips_the_checksum_only_when_asked() -> None:
    blob = bytearray(encode([1, 2, 3]))
    blob[10] ^= 0xFF  # inside the checksum field: the body itself is intact
    assert decode(bytes(blob), verified=True) == [1, 2, 3]
    with pytest.raises(CorruptEntryError):
        decode(bytes(blob))


def test_entries_written_with_crc32_before_still_decode_and_are_checked() -> None:
    body = b"[1,2]"
    old = struct.pack("<4scI", b"HFC1", b"J", zlib.crc32(body)) + body
    assert decode(old) == [1, 2]
    with pytest.raises(CorruptEntryError, match="checksum mismatch"):
        decode(old[:-1] + b"3")


@pytest.mark.parametrize(
    ("blob", "reason"), [(b"HFC2", "too short"), (b"XXXXJ" + bytes(20), "bad magic")]
)
def test_bytes_that_are_no_entry_say_why(blob: bytes, reason: str) -> None:
    with pytest.raises(CorruptEntryError, match=reason):
        decode(blob)


def test_array_layouts_parsed_once_still_decode_each_shape_and_dtype() -> None:
    """Layouts are kept by entry length and matched on the exact header bytes: arrays of other
    shapes or dtypes after a cached one (the same length too) decode as themselves, a truncated
    body is still corrupt, and the cache stays bounded."""
    from hetero.cache import codec

    first = np.arange(12, dtype=np.float32).reshape(3, 4)
    for value in (first, first.reshape(4, 3), first.astype(np.int64), first):
        out = decode(encode(value))
        assert out.dtype == value.dtype and out.shape == value.shape
        assert np.array_equal(out, value)
    blob = encode(first)
    with pytest.raises(CorruptEntryError):
        decode(blob[:-4], verified=True)
    for n in range(codec.LAYOUTS_KEPT + 10):
        assert decode(encode(np.zeros(n + 1, np.uint8))).shape == (n + 1,)
    assert len(codec._LAYOUTS) <= codec.LAYOUTS_KEPT


def test_the_short_path_for_a_known_layout_still_checks_and_still_tells_kinds_apart() -> None:
    value = np.arange(64, dtype=np.float32)
    blob = encode(value)
    assert np.array_equal(decode(blob), value)  # its layout is known from here on
    flipped = bytearray(blob)
    flipped[-1] ^= 0x01  # an array byte: the header still matches the known layout
    with pytest.raises(CorruptEntryError, match="checksum mismatch"):
        decode(bytes(flipped), "disk")
    assert decode(bytes(flipped), verified=True)[-1] != value[-1]  # asked not to check
    text = "x" * (len(blob) - 13 - 2)  # a JSON entry exactly as long as the array's
    other = encode(text)
    assert len(other) == len(blob) and decode(other) == text


def test_decode_from_reads_a_value_in_place_behind_a_record_header_and_still_checks_it() -> None:
    """decode_from decodes the value where a tier's record holds it (behind the record's own
    header): the array is a read-only view into the record, no copy; a flipped value byte is
    still a checksum mismatch on the known layout's short path; an unseen layout and JSON
    decode as decode does."""
    from hetero.cache.codec import decode_from

    value = np.arange(40, dtype=np.float64).reshape(5, 8)
    blob = encode(value)
    header = b"\x07" * 29  # a record header of an odd length: nothing aligned by luck
    record = header + blob
    first = decode_from(record, len(header), "disk")  # a new layout: decode's, of a copy
    assert np.array_equal(first, value) and not first.flags.writeable
    out = decode_from(record, len(header), "disk")  # known now: the short path
    assert np.array_equal(out, value) and out.dtype == value.dtype
    assert not out.flags.writeable
    assert np.shares_memory(out, np.frombuffer(record, np.uint8))  # in place: no copy
    flipped = bytearray(record)
    flipped[-3] ^= 0x10
    with pytest.raises(CorruptEntryError, match="checksum mismatch"):
        decode_from(bytes(flipped), len(header), "disk")
    stored_sum = bytearray(record)
    stored_sum[len(header) + 6] ^= 0x01  # the stored checksum itself
    with pytest.raises(CorruptEntryError, match="checksum mismatch"):
        decode_from(bytes(stored_sum), len(header), "disk")
    assert decode_from(header + encode({"text": "ok"}), len(header)) == {"text": "ok"}
    odd = np.arange(7, dtype=np.int16)  # a layout never seen
    assert np.array_equal(decode_from(header + encode(odd), len(header)), odd)
    assert np.array_equal(decode_from(blob, 0), value)  # a record that is the value
    with pytest.raises(CorruptEntryError):
        decode_from(header + blob[:-4], len(header))


def test_a_mapping_of_arrays_and_json_keeps_each_as_it_was_and_its_key_order() -> None:
    """A vision result: its embedding stays a float32 array (bytes, not JSON floats), the rest
    JSON, the keys in their order; a flipped byte is corrupt; a corrupt index is corrupt."""
    embedding = np.linspace(-1, 1, 1280, dtype=np.float32)
    value = {"embedding": embedding, "labels": [["tabby", 0.5]], "top1": 281, "width": 64}
    blob = encode(value)
    assert blob[4:5] == b"M" and len(blob) < 1280 * 4 + 200  # not 25 KB of JSON floats
    back = decode(blob)
    assert list(back) == list(value)
    assert back["embedding"].dtype == np.float32 and np.array_equal(back["embedding"], embedding)
    assert not back["embedding"].flags.writeable
    assert {k: v for k, v in back.items() if k != "embedding"} == {
        "labels": [["tabby", 0.5]],
        "top1": 281,
        "width": 64,
    }
    flipped = bytearray(blob)
    flipped[-1] ^= 0x01
    with pytest.raises(CorruptEntryError, match="checksum mismatch"):
        decode(bytes(flipped))
    with pytest.raises(CorruptEntryError):
        decode(blob[:-4], verified=True)
    with pytest.raises(CacheValueError):
        encode({"embedding": embedding, "bad": object()})
