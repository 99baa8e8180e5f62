"""Objects of one data partition on disk, every one envelope-encrypted with the partition's key."""

from __future__ import annotations

import os
import re
from pathlib import Path

from hetero.framework.errors import HeteroError
from hetero.sandbox.envelope import open_object, rewrap, seal_object
from hetero.sandbox.keyring import KeyProvider

__all__ = ["PartitionStore", "PartitionStoreError"]

_OBJECT_ID = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


class PartitionStoreError(HeteroError, ValueError):
    """A bad object id, or an object that does not exist."""


class PartitionStore:
    """``root/<partition>/<object id>`` files, sealed under ``key_name`` with ``cipher``."""

    def __init__(
        self, root: Path, partition: str, keyring: KeyProvider, key_name: str, cipher: str
    ) -> None:
        self.directory = root / partition
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.partition = partition
        self.keyring = keyring
        self.key_name = key_name
        self.cipher = cipher

    def _path(self, object_id: str) -> Path:
        if not _OBJECT_ID.match(object_id) or object_id in {".", ".."}:
            raise PartitionStoreError(
                f"bad object id {object_id!r} (letters, digits, '.', '_', '-')"
            )
        return self.directory / object_id

    def put(self, object_id: str, data: bytes) -> None:
        """Store ``data`` encrypted (written to a temporary file, then renamed into place)."""
        path = self._path(object_id)
        sealed = seal_object(
            self.keyring, self.key_name, self.cipher, self.partition, object_id, data
        )
        temporary = path.with_name(f".{path.name}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(sealed)
        temporary.replace(path)

    def get(self, object_id: str) -> bytes:
        """The decrypted object; DecryptionError if it was altered or moved here."""
        path = self._path(object_id)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            raise PartitionStoreError(f"{self.partition}: no object {object_id!r}") from None
        return open_object(self.keyring, self.partition, object_id, blob)

    def delete(self, object_id: str) -> bool:
        """Remove an object; whether it existed."""
        path = self._path(object_id)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def rotate(self) -> int:
        """Re-wrap every object's data key under the newest key version; how many."""
        count = 0
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith("."):
                continue
            path.write_bytes(rewrap(self.keyring, self.partition, path.name, path.read_bytes()))
            count += 1
        return count
