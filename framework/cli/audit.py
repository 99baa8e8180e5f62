"""``hetero audit verify FILE --public-key PEM``: exit 0 when intact, 1 with the first broken
record, 2 when the file or key cannot be read."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from hetero.framework.errors import HeteroError


def run_audit_verify(console: Console, err: Console, file: str, public_key: str) -> int:
    """Verify an audit log against its signer's public key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    from hetero.sandbox.audit import verify

    try:
        key = load_pem_public_key(Path(public_key).read_bytes())
    except (OSError, ValueError) as error:
        raise HeteroError(f"{public_key}: cannot read the public key: {error}") from error
    if not isinstance(key, Ed25519PublicKey):
        raise HeteroError(f"{public_key}: not an Ed25519 public key")
    report = verify(Path(file), key)
    if report.ok:
        console.print(f"ok: {report.records} records, head {report.head[:16]}", highlight=False)
        return 0
    err.print(f"{file}: BROKEN: {report.problem}", highlight=False, markup=False)
    return 1
