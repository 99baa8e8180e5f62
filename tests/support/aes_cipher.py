"""A real AES-256-GCM cipher for cache tests (the sandbox brings the production one)."""

from __future__ import annotations

import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM


class AesGcmTestCipher:
    """AES-256-GCM with a random 96-bit nonce per message, prepended."""

    name = "AES-256-GCM"

    def __init__(self, key: bytes | None = None) -> None:
        self._aead = AESGCM(key or AESGCM.generate_key(bit_length=256))

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, plaintext, associated_data)

    def decrypt(self, sealed: bytes, associated_data: bytes) -> bytes:
        return self._aead.decrypt(sealed[:12], sealed[12:], associated_data)
