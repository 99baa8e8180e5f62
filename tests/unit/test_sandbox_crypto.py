"""Partition crypto: published test vectors, tampering, envelopes, rotation, the keyring."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from hetero.sandbox import (
    AES_256_GCM,
    SM4_GCM,
    CipherUnavailableError,
    DecryptionError,
    FileKeyring,
    KeyringError,
    PartitionStore,
    open_object,
    rewrap,
    seal_object,
)
from hetero.sandbox.ciphers import aead

H = bytes.fromhex


def test_sm4_block_matches_gb_t_32907() -> None:
    key = H("0123456789abcdeffedcba9876543210")
    encryptor = Cipher(algorithms.SM4(key), modes.ECB()).encryptor()
    block = encryptor.update(H("0123456789abcdeffedcba9876543210")) + encryptor.finalize()
    assert block.hex() == "681edf34d206965e86b3e94f536e4246"


def test_sm4_gcm_matches_rfc_8998() -> None:
    sealed = aead(SM4_GCM).seal(
        H("0123456789ABCDEFFEDCBA9876543210"),
        H("00001234567800000000ABCD"),
        H(
            "AAAAAAAAAAAAAAAABBBBBBBBBBBBBBBBCCCCCCCCCCCCCCCCDDDDDDDDDDDDDDDDEEEEEEEEEEEEEEEE"
            "FFFFFFFFFFFFFFFFEEEEEEEEEEEEEEEEAAAAAAAAAAAAAAAA"
        ),
        H("FEEDFACEDEADBEEFFEEDFACEDEADBEEFABADDAD2"),
    )
    assert sealed[:-16].hex().upper() == (
        "17F399F08C67D5EE19D0DC9969C4BB7D5FD46FD3756489069157B282BB200735"
        "D82710CA5C22F0CCFA7CBF93D496AC15A56834CBCF98C397B4024A2691233B8D"
    )
    assert sealed[-16:].hex() == "83de3541e4c2b58177e065a9bf7b62ec"


def test_aes_256_gcm_matches_the_gcm_specification_test_case_16() -> None:
    sealed = aead(AES_256_GCM).seal(
        H("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308"),
        H("cafebabefacedbaddecaf888"),
        H(
            "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
            "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39"
        ),
        H("feedfacedeadbeeffeedfacedeadbeefabaddad2"),
    )
    assert sealed[-16:].hex() == "76fc6ece0f4e1768cddf8853bb2d551b"


@pytest.mark.parametrize("cipher", [AES_256_GCM, SM4_GCM])
@pytest.mark.parametrize("part", ["tag", "ciphertext", "aad"])
def test_tampering_is_rejected(cipher: str, part: str) -> None:
    algorithm = aead(cipher)
    key, nonce = os.urandom(algorithm.key_bytes), os.urandom(12)
    sealed = bytearray(algorithm.seal(key, nonce, b"petition recording", b"partition-a"))
    aad = b"partition-a"
    if part == "tag":
        sealed[-1] ^= 1
    elif part == "ciphertext":
        sealed[0] ^= 1
    else:
        aad = b"partition-b"
    with pytest.raises(DecryptionError):
        algorithm.open(key, nonce, bytes(sealed), aad)
    assert algorithm.open(key, nonce, algorithm.seal(key, nonce, b"x", b"a"), b"a") == b"x"


def test_unknown_cipher_is_a_clear_error() -> None:
    with pytest.raises(CipherUnavailableError, match="unknown cipher 'DES'"):
        aead("DES")


@pytest.fixture
def keyring(tmp_path: Path) -> FileKeyring:
    return FileKeyring.create(tmp_path / "keys.json", {"id-cards": 16, "docs": 32})


@pytest.mark.parametrize(("cipher", "key_name"), [(SM4_GCM, "id-cards"), (AES_256_GCM, "docs")])
def test_envelopes_round_trip_and_bind_partition_and_object(
    keyring: FileKeyring, cipher: str, key_name: str
) -> None:
    blob = seal_object(keyring, key_name, cipher, "id_cards", "scan-1", b"ID 110101199003074512")
    assert b"110101199003074512" not in blob
    assert open_object(keyring, "id_cards", "scan-1", blob) == b"ID 110101199003074512"
    with pytest.raises(DecryptionError):
        open_object(keyring, "petitions", "scan-1", blob)  # copied into another partition
    with pytest.raises(DecryptionError):
        open_object(keyring, "id_cards", "scan-2", blob)  # renamed
    with pytest.raises(DecryptionError, match="malformed"):
        open_object(keyring, "id_cards", "scan-1", blob[:20])  # truncated
    other = seal_object(keyring, key_name, cipher, "id_cards", "scan-1", b"same plaintext")
    assert other != seal_object(keyring, key_name, cipher, "id_cards", "scan-1", b"same plaintext")


def test_rotation_rewraps_without_reencrypting(tmp_path: Path, keyring: FileKeyring) -> None:
    import json

    blob = seal_object(keyring, "docs", AES_256_GCM, "docs", "a", b"payload")
    raw = json.loads(keyring.path.read_text())
    raw["docs"]["2"] = os.urandom(32).hex()
    keyring.path.write_text(json.dumps(raw))
    rotated_ring = FileKeyring(keyring.path)
    rotated = rewrap(rotated_ring, "docs", "a", blob)
    assert rotated[-(12 + 7 + 16) :] == blob[-(12 + 7 + 16) :]  # data nonce and ciphertext kept
    assert rotated != blob
    assert open_object(rotated_ring, "docs", "a", rotated) == b"payload"


def test_keyring_refuses_unsafe_or_missing_files(tmp_path: Path, keyring: FileKeyring) -> None:
    keyring.path.chmod(0o644)
    with pytest.raises(KeyringError, match="chmod 600"):
        FileKeyring(keyring.path)
    with pytest.raises(KeyringError, match="not found"):
        FileKeyring(tmp_path / "absent.json")
    keyring.path.chmod(0o600)
    ring = FileKeyring(keyring.path)
    assert "keys" in repr(ring) and keyring.path.read_text()[10:30] not in repr(ring)
    with pytest.raises(KeyringError, match="no key named 'nope'"):
        seal_object(ring, "nope", AES_256_GCM, "p", "o", b"x")


def test_partition_store_keeps_objects_encrypted_and_in_place(
    tmp_path: Path, keyring: FileKeyring
) -> None:
    cards = PartitionStore(tmp_path / "data", "id_cards", keyring, "id-cards", SM4_GCM)
    docs = PartitionStore(tmp_path / "data", "docs", keyring, "docs", AES_256_GCM)
    cards.put("scan-1", b"CANARY-ID-110101199003074512")
    assert b"CANARY" not in (tmp_path / "data" / "id_cards" / "scan-1").read_bytes()
    assert cards.get("scan-1") == b"CANARY-ID-110101199003074512"
    (tmp_path / "data" / "docs" / "scan-1").write_bytes(
        (tmp_path / "data" / "id_cards" / "scan-1").read_bytes()
    )  # a file copied across partitions
    with pytest.raises(DecryptionError):
        docs.get("scan-1")
    assert cards.rotate().current == ["scan-1"] and cards.get("scan-1").startswith(b"CANARY")
    with pytest.raises(Exception, match="bad object id"):
        cards.put("../escape", b"x")
