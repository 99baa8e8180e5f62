"""Objects of one data partition on disk, every one envelope-encrypted with the partition's key."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from hetero.framework.errors import HeteroError
from hetero.sandbox.ciphers import DecryptionError
from hetero.sandbox.envelope import open_object, rewrap, seal_object, wrapping_key
from hetero.sandbox.keyring import KeyProvider, KeyringError

__all__ = ["PartitionStore", "PartitionStoreError", "RotationReport"]

logger = logging.getLogger(__name__)

_OBJECT_ID = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
SALT_BYTES = 32  # the per-partition salt that keys subject tags and object ids


class PartitionStoreError(HeteroError, ValueError):
    """A bad object id, or an object that does not exist."""


class PartitionStore:
    """``root/<partition>/<object id>`` files, sealed under ``key_name`` with ``cipher``."""

    def __init__(
        self, root: Path, partition: str, keyring: KeyProvider, key_name: str, cipher: str
    ) -> None:
        self.directory = root / partition
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Metadata (creation time, keyed hash of the data subject) sits beside the partition,
        # not in it: a sandbox mounts the partition and never sees who the objects are about.
        self.meta_directory = root / ".meta" / partition
        self.meta_directory.mkdir(parents=True, exist_ok=True, mode=0o700)
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

    def _salt(self) -> bytes:
        """The partition's 32-byte salt, made once. It appears whole or not at all: written to
        a private file, then linked into place (a writer that loses the race reads the
        winner's), so no reader ever keys a subject with an empty or partial salt."""
        salt_path = self.meta_directory / ".salt"
        if not salt_path.exists():
            fresh = salt_path.with_name(f".salt.{os.getpid()}.{os.urandom(4).hex()}")
            descriptor = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(os.urandom(SALT_BYTES))
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(fresh, salt_path)
            except FileExistsError:
                pass  # another writer's salt is in place
            finally:
                fresh.unlink()
        salt = salt_path.read_bytes()
        if len(salt) != SALT_BYTES:
            raise PartitionStoreError(
                f"{salt_path}: {len(salt)} bytes, not a {SALT_BYTES}-byte salt: subject tags "
                "cannot be made (restore the file; a new salt would orphan every tag)"
            )
        return salt

    def _subject_tag(self, subject: str) -> str:
        return hmac.new(self._salt(), subject.encode(), hashlib.sha256).hexdigest()

    def keyed_id(self, prefix: str, data: bytes, subject: str | None) -> str:
        """An object id fixed by the content and the data subject (keyed with the partition's
        salt, so it reveals neither): storing the same input for the same subject again
        names the same object instead of adding a copy."""
        tag = "-" if subject is None else self._subject_tag(subject)
        content = hashlib.blake2b(data, digest_size=32).hexdigest()
        keyed = hmac.new(self._salt(), f"{tag}:{content}".encode(), hashlib.sha256)
        return f"{prefix}-{keyed.hexdigest()[:40]}"

    def exists(self, object_id: str) -> bool:
        """Whether the partition holds ``object_id``."""
        return self._path(object_id).is_file()

    def put(
        self, object_id: str, data: bytes, *, subject: str | None = None, now: float | None = None
    ) -> None:
        """Store ``data`` encrypted (written to a temporary file, then renamed into place).
        ``subject`` names the data subject (a person) for erasure; only a keyed hash of it is
        kept."""
        path = self._path(object_id)
        meta = {
            "created": time.time() if now is None else now,
            "subject": None if subject is None else self._subject_tag(subject),
            # the feature cache's content key (BLAKE2b-256), so erasure can drop derived entries
            "content": hashlib.blake2b(data, digest_size=32).hexdigest(),
        }
        (self.meta_directory / object_id).write_text(json.dumps(meta))
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
        """Remove an object and its metadata; whether it existed."""
        path = self._path(object_id)
        (self.meta_directory / object_id).unlink(missing_ok=True)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def object_ids(self) -> list[str]:
        """Every object in the partition, sorted."""
        return sorted(p.name for p in self.directory.iterdir() if not p.name.startswith("."))

    def _meta(self, object_id: str) -> dict[str, object]:
        try:
            loaded = json.loads((self.meta_directory / object_id).read_text())
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def erase_subject(self, subject: str) -> dict[str, str | None]:
        """Delete every object stored for the data subject ``subject``. Returns each erased
        object id with its content digest, for the feature cache's ``erase_content``."""
        tag = self._subject_tag(subject)
        erased: dict[str, str | None] = {}
        for object_id in self.object_ids():
            meta = self._meta(object_id)
            if meta.get("subject") == tag:
                content = meta.get("content")
                erased[object_id] = content if isinstance(content, str) else None
                self.delete(object_id)
        return erased

    def expire(self, retention_days: float, now: float | None = None) -> list[str]:
        """Delete objects older than the retention period; the ids removed. Objects without
        a recorded creation time use the file's modification time."""
        cutoff = (time.time() if now is None else now) - retention_days * 86_400
        expired = []
        for object_id in self.object_ids():
            created = self._meta(object_id).get("created")
            if not isinstance(created, int | float):
                created = (self.directory / object_id).stat().st_mtime
            if created < cutoff:
                self.delete(object_id)
                expired.append(object_id)
        return expired

    def rotate(self) -> RotationReport:
        """Re-wrap every object's data key under the newest key version.

        Each object is rewritten whole or not at all (a temporary file, then a rename), so a
        run that stops half way leaves every object readable; running again resumes, skipping
        objects already under the newest version. An object that cannot be read or unwrapped
        is left as it is and reported, and the others are still rotated."""
        newest = self.keyring.latest(self.key_name)
        report = RotationReport()
        for object_id in self.object_ids():
            path = self.directory / object_id
            try:
                blob = path.read_bytes()
                if wrapping_key(blob) == (self.key_name, newest):
                    report.current.append(object_id)
                    continue
                rotated = rewrap(self.keyring, self.partition, object_id, blob)
                self._replace(path, rotated)
            except (DecryptionError, KeyringError, OSError) as err:
                report.failed[object_id] = f"{type(err).__name__}: {err}"
                logger.warning("%s/%s not rotated: %s", self.partition, object_id, err)
                continue
            report.rotated.append(object_id)
        return report

    @staticmethod
    def _replace(path: Path, content: bytes) -> None:
        """Write ``content`` beside ``path``, flush it to disk, keep the owner, rename over."""
        temporary = path.with_name(f".{path.name}.rotate.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
            owner = path.stat()
            with contextlib.suppress(PermissionError):  # a sandbox's uid, when we may set it
                os.chown(temporary, owner.st_uid, owner.st_gid)
            temporary.replace(path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise


@dataclass(slots=True)
class RotationReport:
    """What :meth:`PartitionStore.rotate` did, object by object.

    Attributes:
        rotated: Re-wrapped under the newest key version.
        current: Already under it (a resumed run skips them).
        failed: Left as they were, with the reason (unreadable, tampered, unknown key).
    """

    rotated: list[str] = field(default_factory=list)
    current: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Every object is under the newest key version."""
        return not self.failed
