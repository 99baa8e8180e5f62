"""The ``Cipher`` protocol: how the cache (and anything else outside the sandbox) encrypts data
derived from a sensitive partition, without knowing which cipher or key store is behind it.
The sandbox implements it with envelope encryption (AES-256-GCM or SM4-GCM)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Cipher"]


@runtime_checkable
class Cipher(Protocol):
    """Authenticated encryption bound to associated data."""

    name: str

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        """Seal ``plaintext``; the result carries whatever the cipher needs to open it."""
        ...

    def decrypt(self, sealed: bytes, associated_data: bytes) -> bytes:
        """Open what :meth:`encrypt` sealed; raises if it or the associated data was altered."""
        ...
