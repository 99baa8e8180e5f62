"""Data partitions and their protection.

The ciphers (AES-256-GCM, SM4-GCM), key providers (a file keyring; PKCS#11 in ``pkcs11_keyring``,
SoftHSM2 in tests), envelope encryption, the encrypted partition store with erasure and
retention, the partition cipher the feature cache seals sensitive entries with, access decisions
(RBAC + attribute rules), the compliance gate, the signed hash-chained audit log, masking, and
the sandboxes: one OCI spec generator (``oci_spec``) for the runtimes in ``runtimes`` (runc,
containerd, Kata, gVisor, bubblewrap), the worker that runs inside (``worker``) and its host side
(``sandboxed_worker``), runtime selection that fails closed (``selection``) and the server's
sandboxed stages (``serving``). See docs/compliance.md.
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
