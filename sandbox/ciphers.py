"""The two ciphers a partition may use: AES-256-GCM and SM4-GCM (GB/T 32907 block cipher in GCM
mode, RFC 8998), both through ``cryptography``.

SM4-GCM goes through ``cryptography``'s low-level ``Cipher`` API and exists only where the
bundled OpenSSL provides SM4; :func:`sm4_gcm_available` probes once and the error names what is
missing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

from cryptography.exceptions import InvalidTag, UnsupportedAlgorithm
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hetero.framework.errors import HeteroError

__all__ = [
    "AES_256_GCM",
    "SM4_GCM",
    "Aead",
    "CipherKeyError",
    "CipherUnavailableError",
    "DecryptionError",
    "aead",
    "sm4_gcm_available",
]

AES_256_GCM = "AES-256-GCM"
SM4_GCM = "SM4-GCM"
NONCE_BYTES = 12
TAG_BYTES = 16


class CipherUnavailableError(HeteroError, RuntimeError):
    """The cipher a policy asks for does not exist in this build."""


class DecryptionError(HeteroError, ValueError):
    """Ciphertext, tag, key or associated data do not match: tampered, truncated or misplaced."""


class CipherKeyError(HeteroError, ValueError):
    """A key of the wrong length for the cipher was offered for sealing (AES-256-GCM takes only
    32 bytes: a 16-byte key would silently be AES-128)."""


def _sealing_key(name: str, key: bytes, size: int) -> bytes:
    if len(key) != size:
        raise CipherKeyError(f"{name} needs a {size}-byte key, got {len(key)} bytes")
    return key


def _opening_key(name: str, key: bytes, size: int) -> bytes:
    # A blob whose cipher id was changed asks for the other cipher with this key: that is a
    # failed decryption, never another library's ValueError.
    if len(key) != size:
        raise DecryptionError(
            f"{name}: a {len(key)}-byte key cannot open this object (it needs {size}): the "
            "envelope's cipher id or the key was altered"
        )
    return key


class Aead(Protocol):
    """Authenticated encryption with an explicit nonce."""

    @property
    def name(self) -> str:
        """The policy's name for it."""
        ...

    @property
    def key_bytes(self) -> int:
        """Key length."""
        ...

    def seal(self, key: bytes, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
        """Ciphertext with its 16-byte tag appended."""
        ...

    def open(self, key: bytes, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
        """The plaintext; :class:`DecryptionError` if anything was altered."""
        ...


@dataclass(frozen=True, slots=True)
class _AesGcm:
    name: str = AES_256_GCM
    key_bytes: int = 32

    def seal(self, key: bytes, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
        return AESGCM(_sealing_key(self.name, key, self.key_bytes)).encrypt(nonce, plaintext, aad)

    def open(self, key: bytes, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
        cipher = AESGCM(_opening_key(self.name, key, self.key_bytes))
        try:
            return cipher.decrypt(nonce, sealed, aad)
        except InvalidTag as err:
            raise DecryptionError("AES-256-GCM: authentication failed") from err


@dataclass(frozen=True, slots=True)
class _Sm4Gcm:
    name: str = SM4_GCM
    key_bytes: int = 16

    def seal(self, key: bytes, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
        algorithm = algorithms.SM4(_sealing_key(self.name, key, self.key_bytes))
        encryptor = Cipher(algorithm, modes.GCM(nonce)).encryptor()
        encryptor.authenticate_additional_data(aad)
        body = encryptor.update(plaintext) + encryptor.finalize()
        return body + encryptor.tag

    def open(self, key: bytes, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
        if len(sealed) < TAG_BYTES:
            raise DecryptionError("SM4-GCM: shorter than its tag")
        body, tag = sealed[:-TAG_BYTES], sealed[-TAG_BYTES:]
        algorithm = algorithms.SM4(_opening_key(self.name, key, self.key_bytes))
        try:
            decryptor = Cipher(algorithm, modes.GCM(nonce, tag)).decryptor()
            decryptor.authenticate_additional_data(aad)
            return decryptor.update(body) + decryptor.finalize()
        except InvalidTag as err:
            raise DecryptionError("SM4-GCM: authentication failed") from err


@functools.cache
def sm4_gcm_available() -> str | None:
    """None when SM4-GCM works here, else why not."""
    try:
        _Sm4Gcm().seal(bytes(16), bytes(NONCE_BYTES), b"probe", b"")
    except UnsupportedAlgorithm as err:
        return f"this cryptography/OpenSSL build has no SM4-GCM ({err})"
    return None


def aead(name: str) -> Aead:
    """The cipher named in a policy."""
    if name == AES_256_GCM:
        return _AesGcm()
    if name == SM4_GCM:
        missing = sm4_gcm_available()
        if missing is not None:
            raise CipherUnavailableError(
                f"{missing}; install a cryptography wheel built with SM4, or choose AES-256-GCM"
            )
        return _Sm4Gcm()
    raise CipherUnavailableError(f"unknown cipher {name!r} (known: {AES_256_GCM}, {SM4_GCM})")
