"""Partition keys in a hardware security module through PKCS#11 (python-pkcs11).

The partition key is a token object (AES-256, sensitive, not extractable): it never leaves the
token. A data key is wrapped and unwrapped inside the token with AES key wrap with padding
(RFC 5649, ``CKM_AES_KEY_WRAP_PAD``). Tested against SoftHSM2; a government site points
``library`` at its HSM vendor's module. The policy names a key as
``pkcs11:token=<label>;object=<label>``.
"""

from __future__ import annotations

from typing import Any

from hetero.sandbox.ciphers import NONCE_BYTES
from hetero.sandbox.keyring import KeyringError, WrappedKey

__all__ = ["Pkcs11Keyring", "parse_pkcs11_ref"]

SOFTHSM2_LIBRARY = "/usr/lib/softhsm/libsofthsm2.so"
_UNUSED_NONCE = bytes(NONCE_BYTES)  # key wrap needs none; the envelope layout keeps the slot


def parse_pkcs11_ref(ref: str) -> tuple[str, str]:
    """``pkcs11:token=T;object=O`` to ``(T, O)``."""
    scheme, _, rest = ref.partition(":")
    fields = dict(part.split("=", 1) for part in rest.split(";") if "=" in part)
    if scheme != "pkcs11" or "token" not in fields or "object" not in fields:
        raise KeyringError(f"{ref!r}: expected pkcs11:token=<label>;object=<label>")
    return fields["token"], fields["object"]


class Pkcs11Keyring:
    """Wraps and unwraps data keys with keys that stay inside a PKCS#11 token."""

    def __init__(self, token_label: str, pin: str, library: str = SOFTHSM2_LIBRARY) -> None:
        import pkcs11

        self._pkcs11 = pkcs11
        try:
            self._token = pkcs11.lib(library).get_token(token_label=token_label)
            self._session: Any = self._token.open(user_pin=pin, rw=True)
        except (pkcs11.PKCS11Error, RuntimeError, OSError) as err:
            raise KeyringError(
                f"PKCS#11 token {token_label!r} via {library}: {type(err).__name__} {err}".strip()
            ) from err
        self.token_label = token_label

    def __repr__(self) -> str:
        return f"Pkcs11Keyring(token={self.token_label!r})"

    def create_key(self, name: str) -> None:
        """Generate partition key ``name`` inside the token (sensitive, never extractable)."""
        from pkcs11 import Attribute, KeyType

        self._session.generate_key(
            KeyType.AES,
            256,
            label=name,
            store=True,
            template={
                Attribute.EXTRACTABLE: False,
                Attribute.SENSITIVE: True,
                Attribute.WRAP: True,
                Attribute.UNWRAP: True,
            },
        )

    def _key(self, name: str) -> Any:
        from pkcs11 import KeyType, ObjectClass

        try:
            return self._session.get_key(ObjectClass.SECRET_KEY, KeyType.AES, label=name)
        except (self._pkcs11.NoSuchKey, self._pkcs11.MultipleObjectsReturned) as err:
            raise KeyringError(
                f"PKCS#11 token {self.token_label!r}: no single key {name!r}"
            ) from err

    def latest(self, name: str) -> int:
        """Key versions live in the HSM's own rotation; this provider has one per label."""
        self._key(name)
        return 1

    def wrap(self, name: str, cipher: str, data_key: bytes, aad: bytes) -> WrappedKey:
        """Wrap ``data_key`` inside the token under partition key ``name``."""
        from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass

        transient = self._session.create_object(
            {
                Attribute.CLASS: ObjectClass.SECRET_KEY,
                Attribute.KEY_TYPE: KeyType.AES,
                Attribute.VALUE: data_key,
                Attribute.TOKEN: False,
                Attribute.EXTRACTABLE: True,
                Attribute.SENSITIVE: False,
            }
        )
        try:
            sealed = self._key(name).wrap_key(transient, mechanism=Mechanism.AES_KEY_WRAP_PAD)
        finally:
            transient.destroy()
        return WrappedKey(name, 1, _UNUSED_NONCE, bytes(sealed))

    def unwrap(self, wrapped: WrappedKey, cipher: str, aad: bytes) -> bytes:
        """Unwrap inside the token and hand back the data key's bytes."""
        from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass

        from hetero.sandbox.ciphers import DecryptionError

        try:
            key = self._key(wrapped.key_name).unwrap_key(
                ObjectClass.SECRET_KEY,
                KeyType.AES,
                wrapped.sealed,
                mechanism=Mechanism.AES_KEY_WRAP_PAD,
                template={
                    Attribute.TOKEN: False,
                    Attribute.EXTRACTABLE: True,
                    Attribute.SENSITIVE: False,
                },
            )
        except self._pkcs11.PKCS11Error as err:
            raise DecryptionError(f"PKCS#11 unwrap failed: {type(err).__name__}") from err
        try:
            return bytes(key[Attribute.VALUE])
        finally:
            key.destroy()

    def close(self) -> None:
        """Close the session."""
        self._session.close()
