"""Sealed objects under abuse (issue 14, items 7-9): a changed cipher id is a DecryptionError
and the sandbox worker answers it and keeps serving; AES-256-GCM takes 32-byte keys only; key
rotation reports unreadable objects, rotates the rest atomically and resumes."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hetero.sandbox import AES_256_GCM, SM4_GCM, DecryptionError, FileKeyring, KeyringError
from hetero.sandbox.ciphers import CipherKeyError, aead
from hetero.sandbox.envelope import (
    open_object,
    open_with_data_key,
    seal_object,
    unwrap_data_key,
    wrapping_key,
)
from hetero.sandbox.partition_store import PartitionStore
from hetero.sandbox.wire import receive, send

CIPHER_ID_OFFSET = 4  # after b"HEV1"


@pytest.fixture
def keyring(tmp_path: Path) -> FileKeyring:
    return FileKeyring.create(tmp_path / "keys.json", {"sm4": 16, "aes": 32})


def with_cipher_id(blob: bytes, cipher_id: int) -> bytes:
    changed = bytearray(blob)
    changed[CIPHER_ID_OFFSET] = cipher_id
    return bytes(changed)


@pytest.mark.parametrize(
    ("cipher", "key_name", "other_id"), [(AES_256_GCM, "aes", 2), (SM4_GCM, "sm4", 1)]
)
def test_a_changed_cipher_id_is_a_decryption_error(
    keyring: FileKeyring, cipher: str, key_name: str, other_id: int
) -> None:
    blob = seal_object(keyring, key_name, cipher, "p", "o", b"secret")
    data_key = unwrap_data_key(keyring, "p", "o", blob)
    assert open_with_data_key(data_key, "p", "o", blob) == b"secret"  # control
    changed = with_cipher_id(blob, other_id)
    with pytest.raises(DecryptionError):
        open_object(keyring, "p", "o", changed)  # the host side: unwrapping
    with pytest.raises(DecryptionError):
        open_with_data_key(data_key, "p", "o", changed)  # the sandbox side (PKCS#11 unwraps)
    with pytest.raises(DecryptionError, match="malformed"):
        open_object(keyring, "p", "o", with_cipher_id(blob, 9))


@pytest.mark.parametrize("size", [16, 24, 31, 33])
def test_aes_256_gcm_takes_32_byte_keys_only(size: int) -> None:
    algorithm = aead(AES_256_GCM)
    nonce = bytes(12)
    assert algorithm.open(bytes(32), nonce, algorithm.seal(bytes(32), nonce, b"x", b""), b"")
    with pytest.raises(CipherKeyError, match="AES-256-GCM needs a 32-byte key, got"):
        algorithm.seal(os.urandom(size), nonce, b"x", b"")
    with pytest.raises(DecryptionError):
        algorithm.open(os.urandom(size), nonce, bytes(17), b"")


def test_a_keyring_entry_of_the_wrong_length_is_a_clear_error(tmp_path: Path) -> None:
    ring = FileKeyring.create(tmp_path / "keys.json", {"short": 16, "medium": 24, "right": 32})
    assert seal_object(ring, "right", AES_256_GCM, "p", "o", b"x")  # control
    for name, size in (("short", 16), ("medium", 24)):
        with pytest.raises(KeyringError) as caught:
            seal_object(ring, name, AES_256_GCM, "p", "o", b"x")
        message = str(caught.value)
        assert str(ring.path) in message and f"{name!r} version 1 is {size} bytes" in message
        assert "AES-256-GCM needs 32" in message


def test_rotation_reports_unreadable_objects_rotates_the_rest_and_resumes(
    tmp_path: Path, keyring: FileKeyring
) -> None:
    store = PartitionStore(tmp_path / "data", "docs", keyring, "aes", AES_256_GCM)
    for name in ("a", "b", "c", "d"):
        store.put(name, f"object {name}".encode())
    (store.directory / "b").write_bytes(b"not an envelope")
    tampered = bytearray((store.directory / "c").read_bytes())
    tampered[30] ^= 1  # inside the wrapped data key
    (store.directory / "c").write_bytes(bytes(tampered))
    raw = json.loads(keyring.path.read_text())
    raw["aes"]["2"] = os.urandom(32).hex()
    keyring.path.write_text(json.dumps(raw))
    rotated_ring = FileKeyring(keyring.path)
    store = PartitionStore(tmp_path / "data", "docs", rotated_ring, "aes", AES_256_GCM)

    report = store.rotate()
    assert report.rotated == ["a", "d"] and sorted(report.failed) == ["b", "c"]
    assert not report.complete and "DecryptionError" in report.failed["c"]
    for name in ("a", "d"):  # past the broken ones, rotated and readable
        assert wrapping_key((store.directory / name).read_bytes()) == ("aes", 2)
        assert store.get(name) == f"object {name}".encode()
    assert (store.directory / "b").read_bytes() == b"not an envelope"  # left as it was
    assert sorted(p.name for p in store.directory.iterdir()) == ["a", "b", "c", "d"]

    store.put("b", b"object b")  # restored from elsewhere; run again
    resumed = store.rotate()
    assert resumed.rotated == [] and resumed.current == ["a", "b", "d"]
    assert list(resumed.failed) == ["c"]


def test_rotation_is_atomic_per_object(
    tmp_path: Path, keyring: FileKeyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PartitionStore(tmp_path / "data", "docs", keyring, "aes", AES_256_GCM)
    store.put("a", b"object a")
    before = (store.directory / "a").read_bytes()
    raw = json.loads(keyring.path.read_text())
    raw["aes"]["2"] = os.urandom(32).hex()
    keyring.path.write_text(json.dumps(raw))
    store = PartitionStore(tmp_path / "data", "docs", FileKeyring(keyring.path), "aes", AES_256_GCM)

    def fail_fsync(descriptor: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail_fsync)
    report = store.rotate()
    assert "No space left" in report.failed["a"]
    assert (store.directory / "a").read_bytes() == before  # untouched, no temporary left
    assert [p.name for p in store.directory.iterdir()] == ["a"]


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Path]:
    """``python -m hetero.sandbox.worker`` as a plain process (no sandbox: the request loop is
    what is tested); ready once it says it listens."""
    data = tmp_path / "data"
    data.mkdir()
    socket_path = tmp_path / "worker.sock"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hetero.sandbox.worker",
            "--socket",
            str(socket_path),
            "--data",
            str(data),
            "--partition",
            "docs",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    assert "listening" in process.stderr.readline()
    yield socket_path
    process.kill()
    process.wait()
    process.stderr.close()


def call(socket_path: Path, message: dict[str, Any]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX) as connection:
        connection.settimeout(60)
        connection.connect(str(socket_path))
        send(connection, message)
        return receive(connection)


def test_the_worker_answers_a_changed_cipher_id_and_keeps_serving(
    worker: Path, keyring: FileKeyring
) -> None:
    data = worker.parent / "data"
    good = seal_object(keyring, "aes", AES_256_GCM, "docs", "good", b"fine")
    (data / "good").write_bytes(good)
    bad = seal_object(keyring, "aes", AES_256_GCM, "docs", "bad", b"secret")
    bad_key = base64.b64encode(unwrap_data_key(keyring, "docs", "bad", bad)).decode()
    (data / "bad").write_bytes(with_cipher_id(bad, 2))  # SM4 asked of a 32-byte data key
    good_key = base64.b64encode(unwrap_data_key(keyring, "docs", "good", good)).decode()

    answer = call(worker, {"op": "process", "object": "bad", "data_key": bad_key})
    assert answer["ok"] is False and "cannot open this object" in answer["error"]
    junk = call(worker, {"op": "process", "object": "good", "data_key": "@@not base64@@"})
    assert junk["ok"] is False
    served = call(worker, {"op": "process", "object": "good", "data_key": good_key})
    assert served == {"ok": True, "result": {"sha256": served["result"]["sha256"], "bytes": 4}}
