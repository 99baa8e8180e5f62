"""A stand-in for an LMDB environment on a disk that fails (EIO on every call), and a worker
for the several-processes test of the disk tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lmdb


class BrokenEnv:
    """Every transaction and flush raises as a failing disk makes LMDB raise."""

    def begin(self, *args: Any, **kwargs: Any) -> Any:
        raise lmdb.DiskError("mdb_txn_begin: Input/output error")

    def sync(self, *args: Any) -> None:
        raise lmdb.DiskError("mdb_env_sync: Input/output error")

    def close(self) -> None:
        pass


def disk_writer(directory: str, name: str, count: int, ready: Any) -> None:
    """One process writing ``count`` entries into a shared disk tier."""
    from hetero.cache.disk_tier import DiskTier

    tier = DiskTier(Path(directory), 64 * 2**20)
    ready.wait()
    for index in range(count):
        tier.put(f"hetero:f:-:{name}:{index:064x}", name.encode() * 100, 600, name)
    tier.close()
