"""Cache keys: a 256-bit BLAKE2b digest of the content plus everything that changes the result.

A key covers the content bytes, the stage, the model version and the preprocessing parameters,
so a model upgrade or a different resize never serves a stale feature. The content digest is
kept beside the key so every entry derived from one piece of content can be erased.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from hetero.framework.errors import CacheKeyError

__all__ = ["FeatureKey", "content_digest", "feature_key"]

DIGEST_BYTES = 32
PREFIX = "hetero:f"


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def content_digest(content: bytes) -> str:
    """Hex BLAKE2b-256 of the content."""
    return hashlib.blake2b(content, digest_size=DIGEST_BYTES).hexdigest()


@dataclass(frozen=True)
class FeatureKey:
    """One cache entry's identity.

    Attributes:
        digest: BLAKE2b-256 of content digest, stage, model version and parameters (raw bytes).
        content: Hex digest of the content alone (for erasure).
        stage: Stage name.
        partition: Data partition the content belongs to, if any.
    """

    digest: bytes
    content: str
    stage: str
    partition: str | None = None

    @cached_property
    def text(self) -> str:
        """The key as stored in Redis and on disk (built once per key, on first use)."""
        return f"{PREFIX}:{self.partition or '-'}:{self.content}:{self.digest.hex()}"


def feature_key(
    content: bytes | str,
    *,
    stage: str,
    model_version: str,
    params: Mapping[str, Any] | None = None,
    partition: str | None = None,
) -> FeatureKey:
    """The key of a stage's output for ``content`` (raw bytes, or an existing hex digest)."""
    if not stage:
        raise CacheKeyError("stage")
    if not model_version:
        raise CacheKeyError("model version")
    if isinstance(content, bytes | bytearray | memoryview):
        digest_of_content = content_digest(bytes(content))
    elif isinstance(content, str) and len(content) == 2 * DIGEST_BYTES and _is_hex(content):
        digest_of_content = content.lower()
    else:
        raise CacheKeyError("content (bytes, or a 64-character hex digest)")
    if partition is not None and (not partition or ":" in partition or partition == "-"):
        raise CacheKeyError("partition name (non-empty, no ':', not '-')")
    try:
        canonical = json.dumps(params or {}, sort_keys=True, separators=(",", ":"))
    except TypeError as err:
        raise CacheKeyError(f"JSON-able preprocessing parameters ({err})") from err
    material = "\0".join((digest_of_content, stage, model_version, canonical)).encode()
    digest = hashlib.blake2b(material, digest_size=DIGEST_BYTES).digest()
    return FeatureKey(digest=digest, content=digest_of_content, stage=stage, partition=partition)
