"""Data partitions and their protection.

Built so far: the ciphers (AES-256-GCM, SM4-GCM), the file keyring, envelope encryption, the
encrypted partition store and the partition cipher the feature cache seals sensitive entries
with. Sandbox runtimes, PKCS#11, access control, the audit log and masking
arrive with the rest of the compliance issue.
"""

from hetero.sandbox.ciphers import AES_256_GCM, SM4_GCM, CipherUnavailableError, DecryptionError
from hetero.sandbox.envelope import open_object, rewrap, seal_object
from hetero.sandbox.keyring import FileKeyring, KeyringError
from hetero.sandbox.partition_cipher import PartitionCipher
from hetero.sandbox.partition_store import PartitionStore, PartitionStoreError

__all__ = [
    "AES_256_GCM",
    "SM4_GCM",
    "CipherUnavailableError",
    "DecryptionError",
    "FileKeyring",
    "KeyringError",
    "PartitionCipher",
    "PartitionStore",
    "PartitionStoreError",
    "open_object",
    "rewrap",
    "seal_object",
]
