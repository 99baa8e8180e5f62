"""Envelope encryption: a fresh data key per object, wrapped by the partition key.

Blob layout (all lengths little-endian): ``b"HEV1"`` | cipher id (1) | key-name length (1) |
key name | key version (4) | wrap nonce (12) | wrapped-key length (2) | wrapped key | data nonce
(12) | ciphertext with tag. The wrap binds the partition and object id; the data seal binds
them and the cipher: a blob copied into another partition, renamed, or relabelled does not open,
and a tampered key name or version fails the unwrap. Each data key seals one object once, so its
nonce never repeats under it. Key rotation re-wraps the data key under the new key version and
leaves the data nonce and ciphertext byte for byte as they were.
"""

from __future__ import annotations

import os
import struct

from hetero.sandbox.ciphers import AES_256_GCM, NONCE_BYTES, SM4_GCM, DecryptionError, aead
from hetero.sandbox.keyring import KeyProvider, WrappedKey

__all__ = [
    "open_object",
    "open_with_data_key",
    "rewrap",
    "seal_object",
    "unwrap_data_key",
    "wrapping_key",
]

MAGIC = b"HEV1"
CIPHER_IDS = {AES_256_GCM: 1, SM4_GCM: 2}
CIPHER_NAMES = {value: key for key, value in CIPHER_IDS.items()}


def _binding(partition: str, object_id: str) -> bytes:
    return f"hetero-envelope\0{partition}\0{object_id}".encode()


def _header(cipher: str, wrapped: WrappedKey) -> bytes:
    name = wrapped.key_name.encode()
    return (
        MAGIC
        + struct.pack("<BB", CIPHER_IDS[cipher], len(name))
        + name
        + struct.pack("<I", wrapped.version)
        + wrapped.nonce
        + struct.pack("<H", len(wrapped.sealed))
        + wrapped.sealed
    )


def seal_object(
    keyring: KeyProvider,
    key_name: str,
    cipher: str,
    partition: str,
    object_id: str,
    plaintext: bytes,
) -> bytes:
    """Encrypt one object of ``partition`` under a fresh data key wrapped by ``key_name``."""
    algorithm = aead(cipher)
    data_key = os.urandom(algorithm.key_bytes)
    binding = _binding(partition, object_id)
    wrapped = keyring.wrap(key_name, cipher, data_key, binding)
    nonce = os.urandom(NONCE_BYTES)
    body = algorithm.seal(data_key, nonce, plaintext, _data_aad(cipher, binding))
    return _header(cipher, wrapped) + nonce + body


def _data_aad(cipher: str, binding: bytes) -> bytes:
    return MAGIC + bytes([CIPHER_IDS[cipher]]) + binding


def _parse(blob: bytes) -> tuple[str, WrappedKey, int]:
    """Cipher, wrapped key and where the data nonce starts; DecryptionError if malformed."""
    try:
        if blob[:4] != MAGIC:
            raise ValueError("not a hetero envelope")
        cipher_id, name_len = struct.unpack_from("<BB", blob, 4)
        offset = 6
        name = blob[offset : offset + name_len].decode()
        offset += name_len
        (version,) = struct.unpack_from("<I", blob, offset)
        offset += 4
        wrap_nonce = blob[offset : offset + NONCE_BYTES]
        offset += NONCE_BYTES
        (sealed_len,) = struct.unpack_from("<H", blob, offset)
        offset += 2
        sealed = blob[offset : offset + sealed_len]
        offset += sealed_len
        complete = len(blob) >= offset + NONCE_BYTES + 16
        if len(wrap_nonce) != NONCE_BYTES or len(sealed) != sealed_len or not complete:
            raise ValueError("truncated")
        return CIPHER_NAMES[cipher_id], WrappedKey(name, version, wrap_nonce, sealed), offset
    except (struct.error, KeyError, UnicodeDecodeError, ValueError) as err:
        raise DecryptionError(f"malformed envelope: {err}") from None


def open_object(keyring: KeyProvider, partition: str, object_id: str, blob: bytes) -> bytes:
    """Decrypt what :func:`seal_object` produced for this partition and object id."""
    cipher, wrapped, offset = _parse(blob)
    binding = _binding(partition, object_id)
    data_key = keyring.unwrap(wrapped, cipher, binding)
    nonce = blob[offset : offset + NONCE_BYTES]
    return aead(cipher).open(
        data_key, nonce, blob[offset + NONCE_BYTES :], _data_aad(cipher, binding)
    )


def unwrap_data_key(keyring: KeyProvider, partition: str, object_id: str, blob: bytes) -> bytes:
    """The object's data key, unwrapped by the partition key (inside the token for PKCS#11).
    The orchestrator hands only this key to the partition's sandbox, which decrypts there."""
    cipher, wrapped, _ = _parse(blob)
    return keyring.unwrap(wrapped, cipher, _binding(partition, object_id))


def open_with_data_key(data_key: bytes, partition: str, object_id: str, blob: bytes) -> bytes:
    """Decrypt an object given its already unwrapped data key (what a sandbox worker does)."""
    cipher, _, offset = _parse(blob)
    nonce = blob[offset : offset + NONCE_BYTES]
    binding = _binding(partition, object_id)
    return aead(cipher).open(
        data_key, nonce, blob[offset + NONCE_BYTES :], _data_aad(cipher, binding)
    )


def wrapping_key(blob: bytes) -> tuple[str, int]:
    """The partition key name and version that wrap this object's data key."""
    _, wrapped, _ = _parse(blob)
    return wrapped.key_name, wrapped.version


def rewrap(keyring: KeyProvider, partition: str, object_id: str, blob: bytes) -> bytes:
    """The same object with its data key re-wrapped under the newest key version; the data
    ciphertext bytes are unchanged."""
    cipher, wrapped, offset = _parse(blob)
    binding = _binding(partition, object_id)
    data_key = keyring.unwrap(wrapped, cipher, binding)
    rewrapped = keyring.wrap(wrapped.key_name, cipher, data_key, binding)
    return _header(cipher, rewrapped) + blob[offset:]
