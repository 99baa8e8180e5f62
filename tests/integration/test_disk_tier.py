"""The LMDB disk tier on a real disk: byte bound, expiry, erasure indexes, several processes,
and the ways a disk fails (read-only, full, broken), none of which may reach a caller."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import lmdb
import pytest
from broken_disk import BrokenEnv, disk_writer

from hetero.cache import disk_tier
from hetero.cache.disk_tier import DiskTier
from hetero.framework.errors import CacheError


def key(name: str, partition: str = "-", content: str = "c") -> str:
    return f"hetero:f:{partition}:{content}:{name}"


def test_entries_round_trip_and_survive_a_reopen(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 2**20)
    tier.put(key("a"), b"value-a", 60, "c")
    tier.put(key("a"), b"value-a2", 60, "c")  # an overwrite replaces, and is counted once
    assert tier.get(key("a")) == b"value-a2"
    assert tier.get(key("missing")) is None
    held = tier.size_bytes
    tier.close()
    again = DiskTier(tmp_path, 2**20)
    try:
        assert again.get(key("a")) == b"value-a2"
        assert again.size_bytes == held
        assert again.keys() == [key("a")]
    finally:
        again.close()


def test_the_oldest_stored_entries_go_when_the_bound_is_passed(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 10_000)
    try:
        for index in range(100):
            tier.put(key(f"{index:03}"), bytes(500), 60, "c")
        assert tier.size_bytes <= 10_000
        assert tier.evictions > 0
        assert tier.get(key("099")) is not None  # the newest stay
        assert tier.get(key("000")) is None  # the oldest went
        held = len(tier.keys())
        assert 10 <= held < 100
        assert tier.erase_content("c") == held  # the content index lost the evicted ones
        assert tier.size_bytes == 0
    finally:
        tier.close()


def test_an_expired_entry_is_a_miss_and_writes_drop_expired_ones(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 2**20)
    try:
        for index in range(5):
            tier.put(key(f"old-{index}"), b"x", -1, "c")  # expired the moment it is stored
        assert tier.keys() == []  # each write dropped the expired entries, its own included
        tier.put(key("live"), b"x", 60, "c")
        assert tier.keys() == [key("live")]
        tier.put(key("gone"), b"x", -1, "c")  # behind a live entry: no write passes it
        stored = tier.keys()
        assert key("gone") in stored
        assert tier.get(key("gone")) is None
        assert tier.get(key("live")) == b"x"  # the control
        assert tier.keys() == [key("live")]  # the read removed it
    finally:
        tier.close()


def test_erasure_by_content_and_by_partition(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 2**20)
    try:
        tier.put(key("1", "pets", "alice"), b"a", 60, "alice")
        tier.put(key("2", "cards", "alice"), b"a", 60, "alice")
        tier.put(key("3", "cards", "bob"), b"b", 60, "bob")
        tier.put(key("4", "cardsx", "bob"), b"b", 60, "bob")  # a longer name, same prefix
        assert tier.erase_content("alice") == 2
        assert tier.get(key("1", "pets", "alice")) is None
        assert tier.get(key("3", "cards", "bob")) == b"b"  # the control
        assert tier.erase_prefix("hetero:f:cards:") == 1
        assert tier.get(key("4", "cardsx", "bob")) == b"b"
        assert tier.erase_content("nobody") == 0
    finally:
        tier.close()


def test_several_processes_share_one_store(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    writers = [
        context.Process(target=disk_writer, args=(str(tmp_path), name, 200, ready))
        for name in ("left", "right")
    ]
    for writer in writers:
        writer.start()
    ready.set()
    for writer in writers:
        writer.join(timeout=120)
        assert writer.exitcode == 0
    tier = DiskTier(tmp_path, 64 * 2**20)
    try:
        assert len(tier.keys()) == 400
        assert tier.get(key(f"{199:064x}", content="left")) == b"left" * 100
        records = 200 * (18 + len("left") + 400) + 200 * (18 + len("right") + 500)
        stored = tier.keys()
        assert tier.size_bytes == sum(len(k) for k in stored) + records
    finally:
        tier.close()


def test_a_broken_disk_is_a_miss_and_never_raises(tmp_path: Path) -> None:
    errors: list[int] = []
    tier = DiskTier(tmp_path, 2**20, on_error=lambda: errors.append(1))
    tier.put(key("a"), b"x", 60, "c")
    healthy = tier._env
    tier._env = BrokenEnv()
    try:
        assert tier.get(key("a")) is None
        assert not tier.up
        tier.put(key("b"), b"x", 60, "c")  # bypassed, no error
        assert errors
        errors.clear()
        with pytest.raises(CacheError, match="erasing content c failed: mdb_txn_begin"):
            tier.erase_content("c")  # an erasure that cannot happen says so, as a cache error
        with pytest.raises(CacheError, match="erasing entries under hetero:f:p: failed"):
            tier.erase_prefix("hetero:f:p:")
        assert len(errors) == 2  # and counts as the tier's errors
    finally:
        tier._env = healthy
        tier.close()


def test_a_full_disk_stops_writes_and_reads_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = DiskTier(tmp_path, 2**20)
    try:
        tier.put(key("a"), b"x", 60, "c")
        real_store = tier._store

        def disk_full(*args: Any) -> None:
            raise lmdb.DiskError("mdb_txn_commit: No space left on device")

        monkeypatch.setattr(tier, "_store", disk_full)
        tier.put(key("b"), b"y", 60, "c")  # no error reaches the caller
        assert tier.errors == 1
        assert tier.get(key("a")) == b"x"  # reads go on
        monkeypatch.setattr(tier, "_store", real_store)
        tier.put(key("c"), b"z", 60, "c")
        assert tier.get(key("c")) is None  # writes wait out the back-off
        monkeypatch.setattr(disk_tier, "RETRY_AFTER_S", 0.0)
        tier._writes_down_until = 1.0  # the back-off is over
        tier.put(key("c"), b"z", 60, "c")
        assert tier.get(key("c")) == b"z"
    finally:
        tier.close()


def test_a_read_only_store_serves_its_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = DiskTier(tmp_path, 2**20)
    first.put(key("a"), b"x", 60, "c")
    first.close()
    real_open = lmdb.open

    def read_only_fs(path: str, **options: Any) -> Any:
        if not options.get("readonly"):
            raise lmdb.ReadonlyError(f"{path}: Read-only file system")
        return real_open(path, **options)

    monkeypatch.setattr(disk_tier.lmdb, "open", read_only_fs)
    tier = DiskTier(tmp_path, 2**20)
    try:
        assert tier.read_only and tier.up
        assert tier.get(key("a")) == b"x"
        tier.put(key("b"), b"y", 60, "c")  # stores nothing, raises nothing
        assert tier.get(key("b")) is None
        with pytest.raises(CacheError, match="read-only"):
            tier.erase_content("c")
    finally:
        tier.close()


def test_a_folder_that_cannot_be_opened_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk_tier, "RETRY_AFTER_S", 0.0)
    blocked = tmp_path / "store"
    blocked.write_bytes(b"not a folder")
    tier = DiskTier(blocked, 2**20)
    try:
        assert tier.get(key("a")) is None
        tier.put(key("a"), b"x", 60, "c")
        assert tier.erase_content("c") == 0  # no store here: nothing to erase
        blocked.unlink()
        tier.put(key("a"), b"x", 60, "c")
        assert tier.get(key("a")) == b"x"
    finally:
        tier.close()


def test_the_record_read_gives_get_s_value_in_place_and_shares_its_misses(tmp_path: Path) -> None:
    """DiskTier.read: the whole record and where the value starts (what get returns is that
    slice); an absent key, an expired entry (then removed) and a broken disk are misses."""
    tier = DiskTier(tmp_path, 2**20)
    try:
        tier.put(key("a", content="d" * 16), b"value bytes", 60, "d" * 16)
        stored = tier.read(key("a", content="d" * 16))
        assert stored is not None
        record, start = stored
        assert isinstance(record, bytes) and start > 0
        assert record[start:] == tier.get(key("a", content="d" * 16)) == b"value bytes"
        assert tier.read(key("absent")) is None
        tier.put(key("gone"), b"x", 60, "c")
        tier.put(key("late"), b"x", -1, "c")  # behind a live entry: no write drops it
        stored_keys = tier.keys()
        assert key("late") in stored_keys
        assert tier.read(key("late")) is None
        stored_keys = tier.keys()
        assert key("late") not in stored_keys  # the read removed it
        healthy = tier._env
        tier._env = BrokenEnv()
        try:
            assert tier.read(key("gone")) is None
            assert not tier.up
        finally:
            tier._env = healthy
    finally:
        tier.close()
