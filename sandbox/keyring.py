"""Partition keys in a file keyring: the default key provider.

A JSON file mapping key names to versions of hex key material, readable by its owner only:
a keyring that group or others can read is refused, naming the file and the fix. Keys never
appear in logs or ``repr``. Wrapping and unwrapping happen here, so callers never hold a
partition key (the PKCS#11 provider keeps it inside the token instead).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hetero.framework.errors import HeteroError
from hetero.sandbox.ciphers import NONCE_BYTES, aead

__all__ = ["FileKeyring", "KeyProvider", "KeyringError", "WrappedKey"]


class KeyringError(HeteroError, RuntimeError):
    """The keyring file is missing, unsafe, malformed, or lacks the key asked for."""


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A data key sealed under a partition key version."""

    key_name: str
    version: int
    nonce: bytes
    sealed: bytes


class KeyProvider(Protocol):
    """Where partition keys live: they wrap and unwrap data keys, and never hand themselves out."""

    def wrap(self, name: str, cipher: str, data_key: bytes, aad: bytes) -> WrappedKey:
        """Seal a data key under partition key ``name``."""
        ...

    def unwrap(self, wrapped: WrappedKey, cipher: str, aad: bytes) -> bytes:
        """Open a wrapped data key."""
        ...

    def latest(self, name: str) -> int:
        """The version of key ``name`` that :meth:`wrap` uses."""
        ...


class FileKeyring:
    """Key versions by name, from a 0600 JSON file: ``{"name": {"1": "<hex>", "2": ...}}``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            mode = path.stat().st_mode
        except FileNotFoundError as err:
            raise KeyringError(f"{path}: keyring file not found") from err
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyringError(
                f"{path}: keyring is accessible to group or others (mode {stat.filemode(mode)}); "
                f"run: chmod 600 {path}"
            )
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            self._keys = {
                name: {int(version): bytes.fromhex(hexkey) for version, hexkey in versions.items()}
                for name, versions in raw.items()
            }
        except (ValueError, AttributeError, TypeError) as err:
            raise KeyringError(
                f"{path}: not a keyring (name -> version -> hex key): {err}"
            ) from None

    def __repr__(self) -> str:
        return f"FileKeyring({str(self.path)!r}, {len(self._keys)} keys)"

    def latest(self, name: str) -> int:
        """The newest version of key ``name``."""
        if name not in self._keys or not self._keys[name]:
            raise KeyringError(f"{self.path}: no key named {name!r}")
        return max(self._keys[name])

    def _key(self, name: str, version: int) -> bytes:
        try:
            return self._keys[name][version]
        except KeyError:
            raise KeyringError(f"{self.path}: no version {version} of key {name!r}") from None

    def wrap(self, name: str, cipher: str, data_key: bytes, aad: bytes) -> WrappedKey:
        """Seal ``data_key`` under the newest version of ``name``."""
        version = self.latest(name)
        key, algorithm = self._key(name, version), aead(cipher)
        if len(key) != algorithm.key_bytes:
            raise KeyringError(
                f"{self.path}: key {name!r} version {version} is {len(key)} bytes; "
                f"{algorithm.name} needs {algorithm.key_bytes} (hexadecimal: "
                f"{2 * algorithm.key_bytes} digits)"
            )
        nonce = os.urandom(NONCE_BYTES)
        sealed = algorithm.seal(key, nonce, data_key, aad)
        return WrappedKey(name, version, nonce, sealed)

    def unwrap(self, wrapped: WrappedKey, cipher: str, aad: bytes) -> bytes:
        """Open a wrapped data key (any version still in the keyring)."""
        return aead(cipher).open(
            self._key(wrapped.key_name, wrapped.version), wrapped.nonce, wrapped.sealed, aad
        )

    @staticmethod
    def create(path: Path, names: dict[str, int]) -> FileKeyring:
        """Write a new keyring with fresh random keys (``name -> key bytes``), mode 0600."""
        content = {name: {"1": os.urandom(size).hex()} for name, size in names.items()}
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(content, handle)
        return FileKeyring(path)
