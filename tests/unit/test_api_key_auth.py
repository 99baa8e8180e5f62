"""API keys (issue 14, Low items): salted scrypt hashes with a minimum key length, the legacy
sha256 form still accepted with a warning, a keys file others can read refused, and failed
authentication logged and throttled per client."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from hetero.framework.errors import PolicyValidationError
from hetero.framework.policy import Policy, load_policy, load_policy_text
from hetero.framework.server.auth import (
    FAILURE_WINDOW_S,
    FAILURES_ALLOWED,
    MIN_KEY_LENGTH,
    KeyRing,
    hash_api_key,
    hash_key,
)
from hetero.framework.server.errors import APIError

KEY = "k" * 20 + "-0123456789ab"  # 33 characters
OTHER = "o" * 40
DEFAULT = Path(__file__).parents[2] / "policies" / "default.yaml"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def policy_with(keys: str) -> Policy:
    return load_policy_text(DEFAULT.read_text() + f"\nserver:\n  api_keys:\n{keys}", "keys.yaml")


def keyring_for(policy: Policy, clock: Clock | None = None) -> KeyRing:
    spec = policy.spec
    return KeyRing(spec.server, spec.qos, frozenset(spec.sla_tiers), clock=clock or Clock())


def bearer(key: str) -> str:
    return f"Bearer {key}"


def test_keys_are_stored_salted_and_verified(caplog: pytest.LogCaptureFixture) -> None:
    first, second = hash_api_key(KEY), hash_api_key(KEY)
    assert first != second and first.startswith("scrypt$")  # a salt per key
    assert hashlib.sha256(KEY.encode()).hexdigest() not in first
    keyring = keyring_for(policy_with(f"    - {{name: alice, hash: '{first}'}}\n"))
    assert keyring.caller(bearer(KEY), None, "10.0.0.1").principal.name == "alice"
    assert keyring.caller(bearer(KEY), None, "10.0.0.1").principal.name == "alice"  # remembered
    with pytest.raises(APIError) as caught:
        keyring.caller(bearer(OTHER), None, "10.0.0.1")
    assert caught.value.status == 401
    assert "unsalted" not in caplog.text


def test_a_short_key_cannot_be_hashed() -> None:
    with pytest.raises(ValueError, match=f"at least {MIN_KEY_LENGTH} characters"):
        hash_api_key("x" * (MIN_KEY_LENGTH - 1))
    assert hash_api_key("x" * MIN_KEY_LENGTH)  # control


def test_legacy_sha256_keys_still_work_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="hetero.framework.server.auth"):
        keyring = keyring_for(policy_with(f"    - {{name: old, sha256: {hash_key('short')}}}\n"))
    assert "unsalted sha256 (old)" in caplog.text and "hetero keys hash" in caplog.text
    assert keyring.caller(bearer("short"), None, "c").principal.name == "old"


def test_a_key_with_both_or_neither_hash_is_refused() -> None:
    both = f"    - {{name: a, sha256: {'a' * 64}, hash: '{hash_api_key(KEY)}'}}\n"
    with pytest.raises(PolicyValidationError, match="exactly one of hash"):
        policy_with(both)
    with pytest.raises(PolicyValidationError, match="exactly one of hash"):
        policy_with("    - {name: a}\n")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_keys_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"api_keys:\n  - {{name: alice, hash: '{hash_api_key(KEY)}'}}\n")
    text = DEFAULT.read_text() + f"\nserver:\n  api_keys_file: {keys}\n"
    keys.chmod(0o600)
    assert not keyring_for(load_policy_text(text, "p.yaml")).open  # control
    keys.chmod(mode)
    with pytest.raises(PolicyValidationError) as caught:
        keyring_for(load_policy_text(text, "p.yaml"))
    assert str(keys) in str(caught.value) and f"chmod 600 {keys}" in str(caught.value)


def test_failed_authentication_is_logged_and_throttled_per_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    keyring = keyring_for(
        policy_with(f"    - {{name: alice, hash: '{hash_api_key(KEY)}'}}\n"), clock
    )
    with caplog.at_level("WARNING", logger="hetero.framework.server.auth"):
        for attempt in range(FAILURES_ALLOWED):
            with pytest.raises(APIError) as caught:
                keyring.caller(bearer(f"{attempt:040d}"), None, "203.0.113.9")
            assert caught.value.status == 401
            clock.now += 1.0
    assert "authentication failed from 203.0.113.9" in caplog.text
    assert f"failed {FAILURES_ALLOWED} times" in caplog.text
    assert len(caplog.records) == 2  # the first failure and the start of throttling, no flood
    with pytest.raises(APIError) as throttled:
        keyring.caller(bearer(KEY), None, "203.0.113.9")  # even the right key waits
    assert throttled.value.status == 429 and throttled.value.retry_after_s is not None
    assert 0 < throttled.value.retry_after_s <= FAILURE_WINDOW_S
    assert keyring.caller(bearer(KEY), None, "198.51.100.7").principal.name == "alice"  # control
    clock.now += FAILURE_WINDOW_S
    assert keyring.caller(bearer(KEY), None, "203.0.113.9").principal.name == "alice"


def test_the_async_path_gives_the_same_answers() -> None:
    keyring = keyring_for(policy_with(f"    - {{name: alice, hash: '{hash_api_key(KEY)}'}}\n"))

    async def both() -> tuple[str, int]:
        found = await keyring.caller_async(bearer(KEY), None, "c")
        try:
            await keyring.caller_async(bearer(OTHER), None, "c")
        except APIError as err:
            return found.principal.name, err.status
        return found.principal.name, 200

    assert asyncio.run(both()) == ("alice", 401)


def test_the_shipped_policies_still_load() -> None:
    for name in ("default", "gov-onprem", "bench-serve"):
        policy = load_policy(f"builtin:{name}")
        assert policy.stages, name  # each serves something
