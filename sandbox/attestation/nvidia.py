"""NVIDIA Hopper (H100) GPU attestation reports, verified offline.

The report is an SPDM GET_MEASUREMENTS request (its 32-byte nonce at bytes 4-35) followed by the
GPU's response, whose last 96 bytes are an ECDSA P-384 signature (r and s big-endian) over
everything before them. The GPU's device certificate chain (leaf first) must end at the pinned
NVIDIA Device Identity CA, each certificate issued by the next. The measurement reported is the
SHA-384 of the response's measurement record, which changes with any firmware measurement.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from hetero.sandbox.attestation.common import (
    AttestationError,
    RefusedError,
    Verdict,
    all_certificates,
    load_certificates,
    pinned,
    require_valid,
    verify_ecdsa_raw,
    verify_issued,
)

__all__ = ["verify_nvidia"]

REQUEST_BYTES = 37
SIGNATURE_BYTES = 96
SPDM_GET_MEASUREMENTS, SPDM_MEASUREMENTS = 0xE0, 0x60


def _report(data: bytes) -> bytes:
    text = data.strip()
    try:
        return bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return data


def endorse(certs: Sequence[bytes], as_of: datetime.datetime) -> x509.Certificate:
    """The GPU's attestation certificate, its chain checked to the pinned NVIDIA Device
    Identity CA at ``as_of``."""
    if not certs:
        raise AttestationError("NVIDIA evidence needs the GPU's certificate chain (--certs)")
    chain = all_certificates(certs, "certificate")
    root = load_certificates(pinned("nvidia_device_identity_ca.pem"), "pinned NVIDIA root")[0]
    if chain[-1] == root:
        chain = chain[:-1]
    if not chain:
        raise RefusedError("the GPU chain holds only the root: no device certificate")
    verify_issued(root, root, "the pinned NVIDIA Device Identity CA", "itself")
    for index, certificate in enumerate(chain):
        issuer = chain[index + 1] if index + 1 < len(chain) else root
        issuer_name = issuer.subject.rfc4514_string()
        verify_issued(certificate, issuer, certificate.subject.rfc4514_string(), issuer_name)
        require_valid(certificate, as_of, certificate.subject.rfc4514_string())
    leaf = chain[0]
    if len(chain) < 3:
        raise RefusedError(
            "the GPU chain is incomplete: a device chain runs device certificate, BROM, "
            "provisioner, identity CA"
        )
    return leaf


def verify_nvidia(
    evidence: bytes,
    certs: Sequence[bytes],
    as_of: datetime.datetime,
    *,
    endorsed: x509.Certificate | None = None,
) -> Verdict:
    """Verify a Hopper attestation report; :class:`RefusedError` when a check fails."""
    report = _report(evidence)
    if len(report) < REQUEST_BYTES + 8 + SIGNATURE_BYTES:
        raise AttestationError("too short for an SPDM measurements report")
    request, response = report[:REQUEST_BYTES], report[REQUEST_BYTES:]
    if request[1] != SPDM_GET_MEASUREMENTS or response[1] != SPDM_MEASUREMENTS:
        raise AttestationError("not an SPDM GET_MEASUREMENTS request and response")
    record_length = int.from_bytes(response[5:8], "little")
    record = response[8 : 8 + record_length]
    if len(record) != record_length:
        raise AttestationError("the measurement record is truncated")
    leaf = endorsed or endorse(certs, as_of)
    signature = report[-SIGNATURE_BYTES:]
    verify_ecdsa_raw(
        leaf.public_key(),
        int.from_bytes(signature[:48], "big"),
        int.from_bytes(signature[48:], "big"),
        report[:-SIGNATURE_BYTES],
        hashes.SHA384(),
        "the GPU's report against its device certificate",
    )
    return Verdict(
        "nvidia",
        True,
        "OK",
        measurement=hashlib.sha384(record).hexdigest(),
        chip=format(leaf.serial_number, "x"),
        tcb=f"spdm={request[0] >> 4}.{request[0] & 0xF}",
        report_data=request[4:36],
    )
