"""The PKCS#11 key provider against a real SoftHSM2 token (Debian's softhsm2, installed by
`make test`): partition keys stay inside the token; data keys are wrapped and unwrapped there."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from hetero.sandbox import SM4_GCM, DecryptionError, KeyringError, open_object, seal_object
from hetero.sandbox.pkcs11_keyring import Pkcs11Keyring, parse_pkcs11_ref

PIN, SO_PIN, LABEL = "5678", "1234", "hetero-test"


@pytest.fixture(scope="module")
def token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pkcs11Keyring]:
    if shutil.which("softhsm2-util") is None:
        pytest.fail("softhsm2 is not installed: `make test` installs it (tools/sysdeps.sh)")
    home = tmp_path_factory.mktemp("softhsm")
    (home / "tokens").mkdir()
    config = home / "softhsm2.conf"
    config.write_text(f"directories.tokendir = {home / 'tokens'}\nobjectstore.backend = file\n")
    os.environ["SOFTHSM2_CONF"] = str(config)  # read when the library initialises
    subprocess.run(
        [
            "softhsm2-util",
            "--init-token",
            "--free",
            "--label",
            LABEL,
            "--so-pin",
            SO_PIN,
            "--pin",
            PIN,
        ],
        check=True,
        capture_output=True,
    )
    keyring = Pkcs11Keyring(LABEL, PIN)
    keyring.create_key("id-cards")
    yield keyring
    keyring.close()


def test_partition_key_never_leaves_the_token(token: Pkcs11Keyring) -> None:
    from pkcs11 import Attribute
    from pkcs11.exceptions import AttributeSensitive

    key = token._key("id-cards")
    assert key[Attribute.EXTRACTABLE] is False and key[Attribute.SENSITIVE] is True
    with pytest.raises(AttributeSensitive):
        key[Attribute.VALUE]


def test_envelopes_seal_and_open_through_the_hsm(token: Pkcs11Keyring) -> None:
    blob = seal_object(
        token, "id-cards", SM4_GCM, "id_cards", "scan-9", b"CANARY ID 11010519491231002X"
    )
    assert b"CANARY" not in blob
    assert open_object(token, "id_cards", "scan-9", blob) == b"CANARY ID 11010519491231002X"
    with pytest.raises(DecryptionError):
        open_object(token, "petitions", "scan-9", blob)  # the data seal binds the partition
    tampered = bytearray(blob)
    tampered[4 + 2 + len("id-cards") + 4 + 12 + 2 + 3] ^= 1  # inside the wrapped key
    with pytest.raises(DecryptionError):
        open_object(token, "id_cards", "scan-9", bytes(tampered))


def test_missing_keys_wrong_pins_and_bad_references_are_clear(token: Pkcs11Keyring) -> None:
    with pytest.raises(KeyringError, match="no single key 'nope'"):
        seal_object(token, "nope", SM4_GCM, "p", "o", b"x")
    with pytest.raises(KeyringError, match=LABEL):
        Pkcs11Keyring(LABEL, "0000")
    assert parse_pkcs11_ref("pkcs11:token=hetero-gov;object=id-cards") == ("hetero-gov", "id-cards")
    with pytest.raises(KeyringError, match="expected pkcs11:token="):
        parse_pkcs11_ref("pkcs11:object=only")
