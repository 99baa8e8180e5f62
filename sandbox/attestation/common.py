"""What every vendor's verifier shares: the verdict, refusals, pinned roots, certificate
checks at a fixed date, and a small DER reader for vendor extensions.

Errors::

    HeteroError
    └── AttestationError (also ValueError): evidence that cannot be checked at all
        └── RefusedError: evidence that was checked and is not trusted, with the reason
"""

from __future__ import annotations

import datetime
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.hazmat.primitives.hashes import HashAlgorithm

from hetero.framework.errors import HeteroError

__all__ = [
    "KINDS",
    "AttestationError",
    "RefusedError",
    "Verdict",
    "all_certificates",
    "check_report_data",
    "der_items",
    "der_value",
    "extension_bytes",
    "load_certificates",
    "pinned",
    "require_valid",
    "verify_ecdsa_raw",
    "verify_issued",
]

KINDS = ("sev-snp", "tdx", "sgx", "csv", "nvidia")


class AttestationError(HeteroError, ValueError):
    """Evidence, certificates or collateral that cannot be read."""


class RefusedError(AttestationError):
    """Evidence checked and not trusted; ``reason`` says which check failed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a verifier found.

    Attributes:
        kind: ``sev-snp``, ``tdx``, ``sgx``, ``csv`` or ``nvidia``.
        verified: Every check passed (and the partition's policy, when one was applied).
        status: The vendor's TCB status (``UpToDate``, ``OutOfDate``, ...; ``OK`` where the
            vendor has none) or ``Refused``.
        measurement: The launch measurement (MRTD, MRENCLAVE, SNP or CSV measurement, or the
            digest of the GPU's measurement record), hex.
        reason: Why it was refused; empty when verified.
        chip: The chip the evidence names (SNP chip id, GPU device certificate serial, ...).
        tcb: The TCB the evidence reports, as the vendor writes it.
        debug: The guest or enclave is debuggable (its memory is readable by the host).
        report_data: The guest-chosen data bound into the signed report (the nonce).
        signer: MRSIGNER (SGX) or the ID key digest (SNP), hex, where there is one.
        advisories: Intel security advisories the TCB level names.
        tcb_parts: The TCB's named security versions a policy's ``min_tcb`` is checked on.
    """

    kind: str
    verified: bool
    status: str
    measurement: str = ""
    reason: str = ""
    chip: str = ""
    tcb: str = ""
    debug: bool = False
    report_data: bytes = b""
    signer: str = ""
    advisories: tuple[str, ...] = field(default=())
    tcb_parts: tuple[tuple[str, int], ...] = field(default=())

    def refused(self, reason: str) -> Verdict:
        """This verdict, refused for ``reason`` (the facts it read are kept)."""
        return Verdict(
            self.kind,
            False,
            "Refused",
            self.measurement,
            reason,
            self.chip,
            self.tcb,
            self.debug,
            self.report_data,
            self.signer,
            self.advisories,
            self.tcb_parts,
        )

    def as_json(self) -> dict[str, Any]:
        """The CLI's and the audit log's form."""
        return {
            "verified": self.verified,
            "status": self.status,
            "measurement": self.measurement,
            "reason": self.reason,
            "kind": self.kind,
            "chip": self.chip,
            "tcb": self.tcb,
            "debug": self.debug,
            "advisories": list(self.advisories),
        }


def pinned(name: str) -> bytes:
    """A pinned vendor root shipped in ``roots/`` (see its README)."""
    return (files("hetero.sandbox.attestation") / "roots" / name).read_bytes()


def load_certificates(data: bytes, where: str) -> list[x509.Certificate]:
    """Every certificate in ``data`` (PEM, one or several, or one DER)."""
    with warnings.catch_warnings():
        # AMD's VCEKs carry serial number 0, which cryptography warns about and still reads
        warnings.simplefilter("ignore")
        try:
            if b"-----BEGIN CERTIFICATE-----" in data:
                return x509.load_pem_x509_certificates(data)
            return [x509.load_der_x509_certificate(data)]
        except ValueError as err:
            raise AttestationError(f"{where}: not an X.509 certificate ({err})") from None


def _utc(moment: datetime.datetime) -> datetime.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def require_valid(certificate: x509.Certificate, as_of: datetime.datetime, what: str) -> None:
    """Refuse a certificate outside its validity window at ``as_of``."""
    moment = _utc(as_of)
    if moment < certificate.not_valid_before_utc:
        raise RefusedError(
            f"{what} is not valid before {certificate.not_valid_before_utc:%Y-%m-%d}"
        )
    if moment > certificate.not_valid_after_utc:
        raise RefusedError(f"{what} expired on {certificate.not_valid_after_utc:%Y-%m-%d}")


def verify_issued(
    certificate: x509.Certificate, issuer: x509.Certificate, what: str, by: str
) -> None:
    """Refuse ``certificate`` unless ``issuer`` signed it (RSA-PSS, RSA, ECDSA)."""
    try:
        certificate.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature) as err:
        detail = str(err) or "bad signature"
        raise RefusedError(f"{what} is not signed by {by} ({detail})") from None


def verify_ecdsa_raw(
    key: Any, r: int, s: int, message: bytes, algorithm: HashAlgorithm, what: str
) -> None:
    """Refuse unless (r, s) is ``key``'s ECDSA signature of ``message``."""
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise RefusedError(f"{what}: the signing key is not an elliptic-curve key")
    try:
        key.verify(encode_dss_signature(r, s), message, ec.ECDSA(algorithm))
    except InvalidSignature:
        raise RefusedError(f"{what}: bad signature") from None


def check_report_data(report_data: bytes, expected: bytes | None) -> None:
    """Refuse a report whose data does not start with ``expected`` followed by zeros (a
    nonce, or the hash of a nonce and a key, shorter than the field is zero-padded)."""
    if expected is None:
        return
    if len(expected) > len(report_data):
        raise RefusedError(
            f"the expected nonce is {len(expected)} bytes, the report holds {len(report_data)}"
        )
    padded = expected + bytes(len(report_data) - len(expected))
    if report_data != padded:
        raise RefusedError(
            "the report data does not match the nonce (stale or replayed evidence, or "
            "evidence bound to another key)"
        )


def der_items(data: bytes) -> Iterator[tuple[int, bytes]]:
    """The (tag, content) pairs of a run of DER elements (short and long lengths)."""
    offset = 0
    while offset < len(data):
        if offset + 2 > len(data):
            raise AttestationError("truncated DER")
        tag, length = data[offset], data[offset + 1]
        offset += 2
        if length & 0x80:
            count = length & 0x7F
            if count == 0 or count > 4 or offset + count > len(data):
                raise AttestationError("bad DER length")
            length = int.from_bytes(data[offset : offset + count], "big")
            offset += count
        if offset + length > len(data):
            raise AttestationError("truncated DER")
        yield tag, data[offset : offset + length]
        offset += length


def der_value(data: bytes) -> tuple[int, bytes]:
    """The one DER element ``data`` holds."""
    items = list(der_items(data))
    if len(items) != 1:
        raise AttestationError(f"expected one DER element, found {len(items)}")
    return items[0]


def extension_bytes(certificate: x509.Certificate, oid: str) -> bytes | None:
    """The raw value of a vendor extension ``cryptography`` does not know; None if absent."""
    try:
        extension = certificate.extensions.get_extension_for_oid(x509.ObjectIdentifier(oid))
    except x509.ExtensionNotFound:
        return None
    value = extension.value
    raw = getattr(value, "value", None)
    return raw if isinstance(raw, bytes) else None


def all_certificates(blobs: Sequence[bytes], where: str) -> list[x509.Certificate]:
    """Every certificate of every blob, in order."""
    found: list[x509.Certificate] = []
    for index, blob in enumerate(blobs):
        found.extend(load_certificates(blob, f"{where} #{index + 1}"))
    return found
