"""Data partitions and their protection.

Built so far: the ciphers (AES-256-GCM, SM4-GCM), the file keyring, envelope encryption, the
encrypted partition store, the partition cipher the feature cache seals sensitive entries with,
access decisions (RBAC + attribute rules), the signed hash-chained audit log and masking.
Partition keys come from a file keyring or a PKCS#11 token (``pkcs11_keyring``, SoftHSM2 in
tests). The sandbox runtimes arrive with the rest of the compliance issue.
"""

from hetero.sandbox.access import AccessDecision, Principal, decide
from hetero.sandbox.audit import AuditError, AuditLog, VerifyReport, verify
from hetero.sandbox.ciphers import AES_256_GCM, SM4_GCM, CipherUnavailableError, DecryptionError
from hetero.sandbox.envelope import open_object, rewrap, seal_object
from hetero.sandbox.keyring import FileKeyring, KeyringError
from hetero.sandbox.masking import mask_text, mask_value
from hetero.sandbox.partition_cipher import PartitionCipher
from hetero.sandbox.partition_store import PartitionStore, PartitionStoreError

__all__ = [
    "AES_256_GCM",
    "SM4_GCM",
    "AccessDecision",
    "AuditError",
    "AuditLog",
    "CipherUnavailableError",
    "DecryptionError",
    "FileKeyring",
    "KeyringError",
    "PartitionCipher",
    "PartitionStore",
    "PartitionStoreError",
    "Principal",
    "VerifyReport",
    "decide",
    "mask_text",
    "mask_value",
    "open_object",
    "rewrap",
    "seal_object",
    "verify",
]
