"""``hetero attest verify``: check hardware attestation evidence offline, against the pinned
vendor roots and, optionally, a partition's measurement policy.

Prints ``{"verified", "status", "measurement", "reason"}`` (more fields with ``--json``);
exit 0 verified, 1 refused, 2 a usage error (unreadable file, missing input, bad date).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from hetero.framework.errors import HeteroError

__all__ = ["add_attest_parser", "run_attest"]

KINDS = ("sev-snp", "tdx", "sgx", "csv", "nvidia")


def _date(text: str) -> str:
    from hetero.sandbox.attestation import as_of_date

    try:
        as_of_date(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD)") from None
    return text


def add_attest_parser(commands: Any) -> None:
    """``hetero attest verify ...``."""
    attest = commands.add_parser("attest", help="hardware attestation evidence")
    actions = attest.add_subparsers(dest="attest_command", required=True, metavar="ACTION")
    verify = actions.add_parser(
        "verify", help="verify evidence offline against the pinned vendor roots"
    )
    verify.add_argument("--kind", required=True, choices=KINDS, help="evidence kind")
    verify.add_argument("--evidence", required=True, help="the report or quote file")
    verify.add_argument(
        "--certs",
        action="append",
        default=[],
        metavar="FILE",
        help="what comes with the evidence: the VCEK or VLEK, the GPU's chain, the HSK and "
        "CEK (repeatable; the roots are pinned)",
    )
    verify.add_argument("--collateral", help="Intel collateral JSON (TDX, SGX)")
    verify.add_argument(
        "--as-of", required=True, type=_date, help="judge certificates and collateral at this date"
    )
    verify.add_argument("--nonce", help="hex the report data must carry (zero-padded)")
    verify.add_argument("--product", choices=("milan", "genoa", "turin"), help="AMD product")
    verify.add_argument("--policy", help="policy file whose partition's attestation applies")
    verify.add_argument("--partition", help="the partition (with --policy)")
    verify.add_argument("--json", action="store_true", help="every field, as one JSON object")


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise HeteroError(f"{what} {path}: {err.strerror}") from None


def run_attest(out: Console, err: Console, args: argparse.Namespace) -> int:
    """Verify; print the verdict; the exit code."""
    from hetero.sandbox.attestation import as_of_date, verify_evidence

    if (args.policy is None) != (args.partition is None):
        raise HeteroError("--policy and --partition go together")
    policy = None
    if args.policy is not None:
        from hetero.framework.policy import load_policy

        partitions = load_policy(args.policy).spec.partitions
        if args.partition not in partitions:
            raise HeteroError(
                f"no partition {args.partition!r} in {args.policy} "
                f"(have: {', '.join(sorted(partitions))})"
            )
        policy = partitions[args.partition].attestation
        if policy is None:
            raise HeteroError(f"partition {args.partition!r} has no attestation policy")
    nonce = None
    if args.nonce is not None:
        try:
            nonce = bytes.fromhex(args.nonce)
        except ValueError:
            raise HeteroError(f"--nonce {args.nonce!r} is not hex") from None
    verdict = verify_evidence(
        args.kind,
        _read(args.evidence, "evidence"),
        as_of=as_of_date(args.as_of),
        certs=[_read(path, "certificate") for path in args.certs],
        collateral=_read(args.collateral, "collateral") if args.collateral else None,
        report_data=nonce,
        product=args.product,
        policy=policy,
        partition=args.partition or "",
    )
    shown = verdict.as_json()
    if not args.json:
        shown = {key: shown[key] for key in ("verified", "status", "measurement", "reason")}
    out.print(json.dumps(shown, sort_keys=False), highlight=False, markup=False, soft_wrap=True)
    return 0 if verdict.verified else 1
