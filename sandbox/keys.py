"""Opening the key provider a partition's ``key:`` reference names, and checking it exists."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hetero.framework.policy.schema import SandboxConfig
from hetero.sandbox.keyring import FileKeyring, KeyProvider, KeyringError
from hetero.sandbox.pkcs11_keyring import Pkcs11Keyring, parse_pkcs11_ref

__all__ = ["KeyCheck", "check_key", "open_key"]


@dataclass(frozen=True, slots=True)
class KeyCheck:
    """Whether a key reference resolves, and what was found or is missing."""

    ok: bool
    detail: str


def open_key(reference: str, config: SandboxConfig) -> tuple[KeyProvider, str]:
    """The provider holding ``reference`` (``file:NAME`` or ``pkcs11:token=T;object=O``) and
    the key's name in it; :class:`KeyringError` when the key cannot be reached."""
    scheme, _, name = reference.partition(":")
    if scheme == "file":
        keyring = FileKeyring(Path(config.keyring).expanduser())
        keyring.latest(name)
        return keyring, name
    token, label = parse_pkcs11_ref(reference)
    if not Path(config.pkcs11_library).exists():
        raise KeyringError(
            f"PKCS#11 library {config.pkcs11_library} not found (install the HSM vendor's module, "
            "or softhsm2 for testing, and set sandbox.pkcs11_library)"
        )
    pin = os.environ.get(config.pkcs11_pin_env)
    if pin is None:
        raise KeyringError(f"the PKCS#11 PIN is not set: export {config.pkcs11_pin_env}")
    hsm = Pkcs11Keyring(token, pin, config.pkcs11_library)
    hsm.latest(label)
    return hsm, label


def check_key(reference: str, config: SandboxConfig) -> KeyCheck:
    """:func:`open_key` as a yes/no with the reason."""
    try:
        provider, name = open_key(reference, config)
    except KeyringError as err:
        return KeyCheck(False, str(err))
    close = getattr(provider, "close", None)
    if callable(close):
        close()
    return KeyCheck(True, f"{name} found in {provider!r}")
