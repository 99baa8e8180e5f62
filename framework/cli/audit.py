"""``hetero audit verify FILE --public-key PEM``: exit 0 when intact, 1 with the first broken
record (or a missing or stale checkpoint, unless accepted), 2 when the file or key cannot be
read."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from hetero.framework.errors import HeteroError


def run_audit_verify(
    console: Console,
    err: Console,
    file: str,
    public_key: str,
    *,
    policy: str | None = None,
    anchor: str | None = None,
    max_checkpoint_age_s: float | None = None,
    allow_missing_checkpoint: bool = False,
    allow_stale_checkpoint: bool = False,
) -> int:
    """Verify an audit log against its signer's public key. The anchor and the checkpoint age
    come from the flags, else from ``policy``'s ``audit`` section, else the defaults."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    from hetero.sandbox.audit import DEFAULT_MAX_CHECKPOINT_AGE_S, parse_anchor, verify

    try:
        key = load_pem_public_key(Path(public_key).read_bytes())
    except (OSError, ValueError) as error:
        raise HeteroError(f"{public_key}: cannot read the public key: {error}") from error
    if not isinstance(key, Ed25519PublicKey):
        raise HeteroError(f"{public_key}: not an Ed25519 public key")
    anchor_path = Path(anchor).expanduser() if anchor else None
    max_age = max_checkpoint_age_s
    if policy is not None:
        from hetero.framework.policy import load_policy

        audit = load_policy(policy).spec.audit
        if anchor_path is None:
            anchor_path = parse_anchor(audit.anchor)
        if max_age is None:
            max_age = audit.max_checkpoint_age_s
    report = verify(
        Path(file),
        key,
        anchor=anchor_path,
        max_checkpoint_age_s=DEFAULT_MAX_CHECKPOINT_AGE_S if max_age is None else max_age,
        allow_missing_checkpoint=allow_missing_checkpoint,
        allow_stale_checkpoint=allow_stale_checkpoint,
    )
    if report.ok:
        anchored = ", anchored" if anchor_path is not None else ""
        console.print(
            f"ok: {report.records} records, head {report.head[:16]}, "
            f"{report.vouched} vouched for by checkpoint {report.checkpoint_seq}{anchored}",
            highlight=False,
        )
        if report.warning:
            err.print(f"{file}: WARNING: {report.warning}", highlight=False, markup=False)
        return 0
    err.print(f"{file}: BROKEN: {report.problem}", highlight=False, markup=False)
    return 1
