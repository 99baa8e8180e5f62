"""Issue 37: the LMDB disk tier's files are the owner's alone (0600), whatever the umask; they
hold cached features of sensitive partitions (sealed, but their sizes and keys are not)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hetero.cache.disk_tier import DiskTier


def test_lmdb_files_are_created_0600_under_a_permissive_umask(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        tier = DiskTier(tmp_path / "disk", 2**20)
        tier.put("hetero:f:-:c:a", b"value", 60, "c")
        tier.close()
    finally:
        os.umask(previous)
    files = sorted((tmp_path / "disk").glob("*.mdb"))
    assert [path.name for path in files] == ["data.mdb", "lock.mdb"]
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
