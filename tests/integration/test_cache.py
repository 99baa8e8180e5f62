"""The feature cache against a real redis-server (started per test module) and a real disk."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aes_cipher import AesGcmTestCipher
from cache_worker import cache_config, make_key, stampede_worker

from hetero.cache import FeatureCache, feature_key
from hetero.cache.local_redis import RedisServer
from hetero.framework.errors import CacheKeyError, CacheValueError, PolicyValidationError

CANARY = "CANARY-7f3a-ID-110101199003074512"


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


config = cache_config
key = make_key


@pytest.fixture
def cache(redis_server: RedisServer, tmp_path: Path) -> Iterator[FeatureCache]:
    redis_server_client(redis_server).flushall()
    instance = FeatureCache(config(redis_server.url), directory=tmp_path / "disk")
    assert instance.bloom_warm.wait(30)  # Bloom negatives are trusted from here on
    yield instance
    instance.close()


def redis_server_client(server: RedisServer) -> Any:
    import redis

    return redis.Redis.from_url(server.url)


def test_values_round_trip_through_every_tier(cache: FeatureCache) -> None:
    values: list[Any] = [
        np.arange(12, dtype=np.float16).reshape(3, 4),
        np.array([[1, 2], [3, 4]], dtype=np.int64),
        np.zeros((0, 5), dtype=np.uint8),
        {"text": "OCR result", "boxes": [[0, 0, 10, 20]], "score": 0.98},
        ["a", 1, None, True],
    ]
    for index, value in enumerate(values):
        k = key(f"content-{index}".encode())
        cache.put(k, value)
        for tier in (None, "memory-cleared"):
            if tier:
                cache.memory.clear()  # type: ignore[union-attr]
            got = cache.get(k)
            if isinstance(value, np.ndarray):
                assert got.dtype == value.dtype and got.shape == value.shape
                np.testing.assert_array_equal(got, value)
            else:
                assert got == value
    sample = cache.metrics.registry.get_sample_value
    assert sample("hetero_cache_hits_total", {"tier": "memory"}) == len(values)
    lower = cache.tier_order()[1]
    assert sample("hetero_cache_hits_total", {"tier": lower}) == len(values)


def test_read_path_counts_are_read_when_the_registry_is_collected(tmp_path: Path) -> None:
    small = FeatureCache(
        config(None, memory={"max_bytes": 4096}, disk={"enabled": False}),
        directory=tmp_path / "d",
    )
    try:
        assert small.bloom_warm.wait(30)
        sample = small.metrics.registry.get_sample_value
        for index in range(40):  # over 200 bytes each: the 4 KB tier must evict
            small.put(key(f"small-{index}".encode()), ["x" * 200, index])
        assert small.memory is not None and small.memory.evictions > 0
        assert sample("hetero_cache_evictions_total", {"tier": "memory"}) == small.memory.evictions
        assert small.get(key(b"never stored")) is None  # the Bloom filter answers
        assert sample("hetero_cache_bloom_negatives_total") == 1
        assert sample("hetero_cache_misses_total") == 0
        small.put(key(b"gone"), [1])
        small.memory.clear()  # in the Bloom filter, in no tier: a miss in every tier
        assert small.get(key(b"gone")) is None
        assert sample("hetero_cache_misses_total") == 1
        assert sample("hetero_cache_hits_total", {"tier": "memory"}) == 0
        small.put(key(b"here"), [2])
        assert small.get(key(b"here")) == [2]
        assert sample("hetero_cache_hits_total", {"tier": "memory"}) == 1
    finally:
        small.close()


def test_a_hit_below_promotes_to_the_faster_tiers(
    cache: FeatureCache, redis_server: RedisServer
) -> None:
    k = key(b"promote")
    cache.put(k, np.ones(4, np.float32))
    cache.memory.clear()  # type: ignore[union-attr]
    cache.disk.delete(k.text)  # type: ignore[union-attr]
    assert cache.get(k) is not None  # only Redis has it now
    assert cache.disk.get(k.text) is not None  # type: ignore[union-attr]
    assert cache.memory.get(k.digest, time.monotonic()) is not None  # type: ignore[union-attr]


def test_tiers_are_asked_in_measured_cost_order(cache: FeatureCache) -> None:
    assert cache.tier_order()[0] == "memory"
    assert set(cache.tier_order()[1:]) == {"disk", "redis"}
    cache._cost.update({"disk": 1e-3, "redis": 1e-5})  # a slow disk and a fast Redis
    cache._order()
    assert cache.tier_order() == ["memory", "redis", "disk"]
    cache._cost.update({"disk": 1e-6, "redis": 1e-4})
    cache._order()
    assert cache.tier_order() == ["memory", "disk", "redis"]


def test_never_seen_content_costs_no_trip_below(
    cache: FeatureCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    for tier in (cache.disk, cache.redis):
        for method in ("get", "read"):  # read: a lookup's one-copy read of the first tier
            original = getattr(tier, method)
            counted = lambda text, o=original: calls.append(text) or o(text)  # noqa: E731
            monkeypatch.setattr(tier, method, counted)
    for index in range(1000):
        assert cache.get(key(f"never-{index}".encode())) is None
    assert len(calls) < 50  # only Bloom false positives (about 1%) go below
    assert cache.metrics.registry.get_sample_value("hetero_cache_bloom_negatives_total") > 950
    known = key(b"known")
    cache.put(known, [1])
    cache.memory.clear()  # type: ignore[union-attr]
    assert cache.get(known) == [1]  # the control: a stored key does go below
    assert known.text in calls


def test_bloom_sized_for_100k_has_no_false_negatives_and_about_1pct_false_positives() -> None:
    from hetero.cache.bloom import GenerationalBloom

    bloom = GenerationalBloom(100_000, 0.01, rotate_after_s=3600)
    inserted = [key(f"in-{i}".encode()).digest for i in range(100_000)]
    bloom.add_many(inserted)
    assert all(bloom.might_contain(d) for d in inserted)
    others = [key(f"out-{i}".encode()).digest for i in range(100_000)]
    rate = sum(bloom.might_contain(d) for d in others) / len(others)
    assert 0.005 <= rate <= 0.02, rate


def test_bloom_rate_is_about_2p_once_both_generations_are_full_and_idle_rotates_once() -> None:
    from hetero.cache.bloom import GenerationalBloom

    bloom = GenerationalBloom(50_000, 0.01, rotate_after_s=3600)
    older = [key(f"old-{i}".encode()).digest for i in range(50_000)]
    newer = [key(f"new-{i}".encode()).digest for i in range(50_000)]
    others = [key(f"out-{i}".encode()).digest for i in range(50_000)]
    bloom.add_many(older)
    bloom._rotate_at = 0.0  # the period is over (the clock, not a sleep)
    assert bloom.might_contain(older[0])  # rotated: the older keys are the previous generation
    bloom.add_many(newer)
    assert all(bloom.might_contain(d) for d in older + newer)  # no false negative in either
    both_full = sum(bloom.might_contain(d) for d in others) / len(others)
    assert 0.015 <= both_full <= 0.026, both_full  # about 1 - (1 - p)^2, not p
    # Idle for many periods: the next use rotates once, so the previous generation (newer)
    # is still asked, and only the one before it (older) is forgotten.
    bloom._rotate_at = 0.0
    assert all(bloom.might_contain(d) for d in newer)
    forgotten = sum(bloom.might_contain(d) for d in older) / len(older)
    assert forgotten < 0.02, forgotten  # the control: older keys now answer only as p allows
    just_rotated = sum(bloom.might_contain(d) for d in others) / len(others)
    assert just_rotated < 0.015, just_rotated  # one full generation: about p


def test_one_writer_makes_its_key_visible_to_another_instances_bloom(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    first = FeatureCache(config(redis_server.url), directory=tmp_path / "a")
    second = FeatureCache(config(redis_server.url), directory=tmp_path / "b")
    try:
        k = key(b"shared-write")
        assert not second.bloom.might_contain(k.digest)
        first.put(k, [42])
        deadline = time.monotonic() + 10
        while not second.bloom.might_contain(k.digest):  # delivered by Redis pub/sub
            assert time.monotonic() < deadline, "the write never reached the other filter"
            time.sleep(0.005)
        assert second.get(k) == [42]  # found in Redis, though never written by this instance
    finally:
        first.close()
        second.close()


def wait_until(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def test_100_concurrent_misses_compute_once(cache: FeatureCache) -> None:
    k = key(b"stampede")
    release = threading.Event()
    computed: list[int] = []

    def compute() -> Any:
        computed.append(1)
        release.wait(timeout=30)
        return np.full(8, 7.0)

    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get_or_compute(k, compute)))
        for _ in range(100)
    ]
    for thread in threads:
        thread.start()
    wait_until(lambda: cache.single_flight.waits >= 99)
    release.set()
    for thread in threads:
        thread.join()
    assert len(computed) == 1
    assert len(results) == 100 and all(np.array_equal(r, np.full(8, 7.0)) for r in results)


def test_the_leaders_error_reaches_every_waiter_and_is_not_cached(cache: FeatureCache) -> None:
    k = key(b"fails")
    release = threading.Event()

    def compute() -> Any:
        release.wait(timeout=30)
        raise RuntimeError("encoder crashed")

    errors: list[BaseException] = []

    def call() -> None:
        try:
            cache.get_or_compute(k, compute)
        except RuntimeError as err:
            errors.append(err)

    threads = [threading.Thread(target=call) for _ in range(20)]
    for thread in threads:
        thread.start()
    wait_until(lambda: cache.single_flight.waits >= 19)
    release.set()
    for thread in threads:
        thread.join()
    assert len(errors) == 20 and all("encoder crashed" in str(e) for e in errors)
    assert cache.get(k) is None


def test_concurrent_misses_across_two_processes_compute_once(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    client = redis_server_client(redis_server)
    client.flushall()
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    processes = [
        context.Process(
            target=stampede_worker, args=(redis_server.url, str(tmp_path / f"p{i}"), 50, ready)
        )
        for i in range(2)
    ]
    for process in processes:
        process.start()
    ready.set()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    assert int(client.get("test:computations")) == 1


def test_killing_redis_mid_load_loses_no_request(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    instance = FeatureCache(config(server.url), directory=tmp_path / "disk")
    try:
        answered = 0
        for index in range(400):
            if index == 150:
                server.stop()  # Redis dies in the middle of the load
            if index == 300:
                server.start()  # and comes back on the same port
            k = key(f"load-{index}".encode())
            if instance.get(k) is None:
                instance.put(k, [index])
            assert instance.get(k) == [index]  # served from memory or disk whatever Redis does
            answered += 1
        assert answered == 400
        assert instance.redis.errors > 0  # type: ignore[union-attr]
        fresh = key(b"after-restart")
        deadline = time.monotonic() + 10
        while True:  # the tier retries after its back-off, then writes reach Redis again
            instance.put(fresh, [1])
            if redis_server_client(server).exists(fresh.text):
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        instance.close()
        server.stop()


def _scan_for(server: RedisServer, directory: Path, needle: bytes) -> bool:
    client = redis_server_client(server)
    for name in client.scan_iter("*"):
        if client.type(name) == b"string" and needle in (client.get(name) or b""):
            return True
    return any(needle in path.read_bytes() for path in directory.rglob("*") if path.is_file())


def test_sensitive_entries_never_appear_in_plaintext(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    redis_server_client(redis_server).flushall()
    instance = FeatureCache(
        config(redis_server.url),
        directory=tmp_path / "disk",
        sensitive=frozenset({"id_cards"}),
        cipher_for=lambda partition: (
            AesGcmTestCipher(b"k" * 32) if partition == "id_cards" else None
        ),
    )
    try:
        secret = key(b"id-card-scan", stage="ocr", partition="id_cards")
        instance.put(secret, {"id_number": CANARY})
        assert not _scan_for(redis_server, tmp_path / "disk", CANARY.encode())
        instance.memory.clear()  # type: ignore[union-attr]
        assert instance.get(secret) == {"id_number": CANARY}  # decrypts on the way back
        public = key(b"brochure", stage="ocr", partition="public")
        instance.put(public, {"text": CANARY})
        assert _scan_for(redis_server, tmp_path / "disk", CANARY.encode())  # the control
    finally:
        instance.close()


def test_sensitive_skip_caches_nothing(redis_server: RedisServer, tmp_path: Path) -> None:
    instance = FeatureCache(
        config(redis_server.url, sensitive="skip"),
        directory=tmp_path / "disk",
        sensitive=frozenset({"id_cards"}),
    )
    try:
        secret = key(b"skip-me", partition="id_cards")
        instance.put(secret, [CANARY])
        assert instance.get(secret) is None
        assert instance.get_or_compute(secret, lambda: [2]) == [2]
        assert not redis_server_client(redis_server).exists(secret.text)
    finally:
        instance.close()


def test_erasure_removes_content_and_partitions_from_every_tier(
    cache: FeatureCache, redis_server: RedisServer
) -> None:
    client = redis_server_client(redis_server)
    a_vision, a_ocr = key(b"person-a"), key(b"person-a", stage="ocr")
    b_vision = key(b"person-b")
    p_entry = key(b"petition", partition="petitions")
    for k in (a_vision, a_ocr, b_vision, p_entry):
        cache.put(k, [k.stage])
    assert cache.erase_content(a_vision.content) == 4  # two entries, in disk and in Redis
    for k in (a_vision, a_ocr):
        assert cache.get(k) is None
        assert not client.exists(k.text) and cache.disk.get(k.text) is None  # type: ignore[union-attr]
    assert cache.get(b_vision) == ["vision"]  # the control: other content stays
    assert cache.erase_partition("petitions") == 2
    assert cache.get(p_entry) is None and not client.exists(p_entry.text)
    assert cache.get(b_vision) == ["vision"]


def test_restart_keeps_the_disk_tier(tmp_path: Path) -> None:
    k = key(b"persist")
    first = FeatureCache(config(None), directory=tmp_path / "disk")
    first.put(k, np.arange(3))
    first.close()
    second = FeatureCache(config(None), directory=tmp_path / "disk")
    try:
        assert second.bloom_warm.wait(30)
        np.testing.assert_array_equal(second.get(k), np.arange(3))  # warmed Bloom, disk hit
    finally:
        second.close()


def test_reads_before_the_bloom_filter_is_warm_still_find_disk_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    k = key(b"early")
    first = FeatureCache(config(None), directory=tmp_path / "disk")
    first.put(k, [7])
    first.close()
    release = threading.Event()
    fill = FeatureCache._fill_bloom

    def slow_fill(self: FeatureCache) -> None:
        assert release.wait(30)
        fill(self)

    monkeypatch.setattr(FeatureCache, "_fill_bloom", slow_fill)
    second = FeatureCache(config(None), directory=tmp_path / "disk")
    try:
        assert not second.bloom_warm.is_set()
        assert second.get(k) == [7]  # the cold filter would have said no; the disk says yes
        release.set()
        assert second.bloom_warm.wait(30)
        assert second.get(key(b"never stored")) is None
    finally:
        release.set()
        second.close()


def test_corrupt_bytes_are_a_miss_and_are_removed(cache: FeatureCache) -> None:
    k = key(b"corrupt")
    cache.put(k, [1, 2])
    cache.memory.clear()  # type: ignore[union-attr]
    cache.disk.put(k.text, b"HFC1Jgarbage-not-a-checksum", 60, k.content)  # type: ignore[union-attr]
    cache.redis.client.set(k.text, b"\x00\x01")  # type: ignore[union-attr]
    assert cache.get(k) is None
    assert cache.disk.get(k.text) is None  # type: ignore[union-attr]
    assert not cache.redis.client.exists(k.text)  # type: ignore[union-attr]


def test_bad_values_and_keys_are_clear_errors(cache: FeatureCache) -> None:
    with pytest.raises(CacheValueError, match="cannot cache a set"):
        cache.put(key(b"x"), {1, 2})
    with pytest.raises(CacheValueError, match="array of objects"):
        cache.put(key(b"x"), np.array([object()]))
    with pytest.raises(CacheKeyError, match="stage"):
        feature_key(b"x", stage="", model_version="v1")
    with pytest.raises(CacheKeyError, match="content"):
        feature_key("not-a-digest", stage="s", model_version="v1")


@pytest.mark.parametrize(
    ("old", "new", "key_path", "problem"),
    [
        (
            "memory: {max_bytes: 256 MiB}",
            "memory: {max_bytes: -5}",
            "cache.memory.max_bytes",
            "expected a positive integer, got -5",
        ),
        (
            "redis: {enabled: false}",
            "redis: {enabled: false}\n  bloom: {false_positive_rate: 1.5}",
            "cache.bloom.false_positive_rate",
            "less than 1",
        ),
        (
            "redis: {enabled: false}",
            "redis: {enabled: true, url: 'http://example'}",
            "cache.redis.url",
            "expected a redis://, rediss:// or unix:// URL",
        ),
        (
            "redis: {enabled: false}",
            "redis: {enabled: true, url: 'redis://h:port/0'}",
            "cache.redis.url",
            "bad port",
        ),
    ],
)
def test_bad_cache_policy_values_name_line_and_key(
    old: str, new: str, key_path: str, problem: str
) -> None:
    from hetero.framework.policy import load_policy_text

    text = (Path(__file__).parents[2] / "policies" / "default.yaml").read_text()
    assert old in text
    with pytest.raises(PolicyValidationError) as caught:
        load_policy_text(text.replace(old, new), "p.yaml")
    assert caught.value.key_path == key_path
    assert problem in caught.value.problem
    assert caught.value.line is not None


def test_a_failing_disk_is_bypassed_and_the_cache_goes_on(
    cache: FeatureCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    from broken_disk import BrokenEnv

    k = key(b"disk-broken")
    monkeypatch.setattr(cache.disk, "_env", BrokenEnv())  # every read and write raises EIO
    cache.put(k, [5])
    cache.memory.clear()  # type: ignore[union-attr]
    assert cache.get(k) == [5]  # from Redis
    assert not cache.disk.up  # type: ignore[union-attr]
    errors = cache.metrics.registry.get_sample_value("hetero_cache_errors_total", {"tier": "disk"})
    assert errors is not None and errors >= 1


def test_a_disk_that_failed_at_start_up_is_reopened_after_the_back_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hetero.cache import disk_tier

    monkeypatch.setattr(disk_tier, "RETRY_AFTER_S", 0.0)  # every call may retry at once
    blocked = tmp_path / "disk"
    blocked.write_bytes(b"a file where the store's folder should be")
    instance = FeatureCache(config(None), directory=blocked)
    try:
        k = key(b"before-the-disk-came-back")
        instance.put(k, [1])  # no error reaches the caller
        instance.memory.clear()  # type: ignore[union-attr]
        assert instance.get(k) is None  # the control: nothing could be stored
        assert instance.disk.errors >= 1  # type: ignore[union-attr]
        blocked.unlink()
        instance.put(k, [2])  # the tier opens the store again on its own
        instance.memory.clear()  # type: ignore[union-attr]
        assert instance.get(k) == [2]
        assert (blocked / "data.mdb").is_file()
    finally:
        instance.close()


def test_erasure_reaches_other_instances_memory_and_disk(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    redis_server_client(redis_server).flushall()
    here = FeatureCache(config(redis_server.url), directory=tmp_path / "here")
    there = FeatureCache(config(redis_server.url), directory=tmp_path / "there")
    try:
        k = key(b"data-subject")
        there.put(k, ["x"])
        assert there.disk.get(k.text) is not None  # type: ignore[union-attr]
        here.erase_content(k.content)
        deadline = time.monotonic() + 10
        while there.disk.get(k.text) is not None:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the other instance never erased its disk"
            time.sleep(0.005)
        assert there.get(k) is None
    finally:
        here.close()
        there.close()


def test_cached_values_are_isolated_from_callers(cache: FeatureCache) -> None:
    k = key(b"mutable")
    original = np.arange(4.0)
    cache.put(k, original)
    original[0] = 99.0  # the caller keeps changing its array
    got = cache.get(k)
    assert got[0] == 0.0 and not got.flags.writeable
    scalar = key(b"scalar")
    cache.put(scalar, np.array(3.5))
    cache.memory.clear()  # type: ignore[union-attr]
    assert cache.get(scalar).shape == ()


def test_key_parts_are_checked() -> None:
    digest = "AB" * 32
    assert feature_key(digest, stage="s", model_version="1").content == "ab" * 32
    with pytest.raises(CacheKeyError, match="content"):
        feature_key("zz" * 32, stage="s", model_version="1")
    with pytest.raises(CacheKeyError, match="partition"):
        feature_key(b"x", stage="s", model_version="1", partition="a:b")
    with pytest.raises(CacheValueError, match="structured"):
        from hetero.cache.codec import encode

        encode(np.zeros(2, dtype=[("a", "i4"), ("b", "f4")]))


def test_a_sensitive_leaders_error_does_not_leave_its_message_in_redis(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    client = redis_server_client(redis_server)
    client.flushall()
    instance = FeatureCache(
        config(redis_server.url),
        directory=tmp_path / "disk",
        sensitive=frozenset({"id_cards"}),
        cipher_for=lambda partition: AesGcmTestCipher(b"k" * 32),
    )
    try:
        secret = key(b"card", partition="id_cards")

        def fail() -> Any:
            raise ValueError(f"bad id {CANARY}")

        with pytest.raises(ValueError, match="bad id"):
            instance.get_or_compute(secret, fail)
        assert not _scan_for(redis_server, tmp_path / "disk", CANARY.encode())
    finally:
        instance.close()


def test_the_sandbox_partition_cipher_seals_cache_entries(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    from hetero.sandbox import SM4_GCM, FileKeyring, PartitionCipher

    redis_server_client(redis_server).flushall()
    keyring = FileKeyring.create(tmp_path / "keys.json", {"id-cards": 16})
    cipher = PartitionCipher(keyring, "id_cards", "id-cards", SM4_GCM)
    instance = FeatureCache(
        config(redis_server.url),
        directory=tmp_path / "disk",
        sensitive=frozenset({"id_cards"}),
        cipher_for=lambda partition: cipher if partition == "id_cards" else None,
    )
    try:
        secret = key(b"card-image", stage="ocr", partition="id_cards")
        instance.put(secret, {"id_number": CANARY})
        assert not _scan_for(redis_server, tmp_path / "disk", CANARY.encode())
        instance.memory.clear()  # type: ignore[union-attr]
        assert instance.get(secret) == {"id_number": CANARY}
    finally:
        instance.close()


def test_several_keys_are_read_in_one_round_trip_per_tier(
    cache: FeatureCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = [key(f"many-{index}".encode()) for index in range(6)]
    for index, k in enumerate(stored):
        cache.put(k, [index])
    cache.memory.clear()  # type: ignore[union-attr]
    cache.memory.put(stored[0].digest, [0], 10, time.monotonic() + 60)  # type: ignore[union-attr]
    for k in stored[1:3]:
        cache.disk.delete(k.text)  # type: ignore[union-attr]  # only Redis has these two
    calls: dict[str, int] = {"redis": 0, "disk": 0, "single": 0}
    for tier in (cache.disk, cache.redis):
        many = tier.get_many  # type: ignore[union-attr]

        def counted(texts: list[str], o: Any = many, name: str = tier.name) -> Any:  # type: ignore[union-attr]
            calls[name] += 1
            return o(texts)

        monkeypatch.setattr(tier, "get_many", counted)
        monkeypatch.setattr(tier, "get", lambda text: calls.__setitem__("single", 1))
    asked = [*stored, key(b"never-stored")]
    values = cache.get_many(asked)
    assert values == [[0], [1], [2], [3], [4], [5], None]
    assert calls == {"redis": 1, "disk": 1, "single": 0}  # memory, then each tier once
    assert cache.disk.get_many([k.text for k in stored[1:3]]) != [None, None]  # type: ignore[union-attr]  # promoted
    assert cache.memory.get(stored[1].digest, time.monotonic()) == [1]  # type: ignore[union-attr]
    sample = cache.metrics.registry.get_sample_value
    assert sample("hetero_cache_hits_total", {"tier": "redis"}) >= 2
    assert sample("hetero_cache_misses_total") + sample("hetero_cache_bloom_negatives_total") >= 1


def test_get_many_with_redis_down_reads_the_disk(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    instance = FeatureCache(config(server.url), directory=tmp_path / "disk")
    try:
        stored = [key(f"down-{index}".encode()) for index in range(3)]
        for index, k in enumerate(stored):
            instance.put(k, [index])
        instance.memory.clear()  # type: ignore[union-attr]
        server.stop()
        instance._cost.update({"redis": 1e-6, "disk": 1e-3})  # Redis asked first
        instance._order()
        assert instance.get_many(stored) == [[0], [1], [2]]
    finally:
        instance.close()
        server.stop()
