"""A partition's envelope encryption behind the core's ``Cipher`` protocol, for the feature
cache: each sealed value gets its own data key, wrapped by the partition key, and is bound to
the partition and to the associated data (the cache key)."""

from __future__ import annotations

import hashlib

from hetero.sandbox.envelope import open_object, seal_object
from hetero.sandbox.keyring import KeyProvider

__all__ = ["PartitionCipher"]


class PartitionCipher:
    """Implements :class:`hetero.framework.cipher.Cipher` for one partition."""

    def __init__(self, keyring: KeyProvider, partition: str, key_name: str, cipher: str) -> None:
        self.keyring = keyring
        self.partition = partition
        self.key_name = key_name
        self.name = cipher

    @staticmethod
    def _object_id(associated_data: bytes) -> str:
        return hashlib.blake2b(associated_data, digest_size=16).hexdigest()

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> bytes:
        """Seal under a fresh data key."""
        return seal_object(
            self.keyring,
            self.key_name,
            self.name,
            self.partition,
            self._object_id(associated_data),
            plaintext,
        )

    def decrypt(self, sealed: bytes, associated_data: bytes) -> bytes:
        """Open; DecryptionError if altered or sealed for other associated data."""
        return open_object(self.keyring, self.partition, self._object_id(associated_data), sealed)
