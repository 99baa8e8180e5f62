"""AMD SEV-SNP attestation reports (1184 bytes, versions 2 and 3), verified offline.

Chain: the pinned ARK of the product (self-signed, RSA-PSS SHA-384) signs the ASK (or, for a
VLEK, the ASVK), which signs the VCEK or VLEK the evidence brings. The report is signed with
ECDSA P-384 over bytes 0x000-0x29F (r and s little-endian, 72 bytes each, at 0x2A0). A VCEK
belongs to one chip and one TCB: its hardware-id extension must equal the report's ``chip_id``
and its TCB extensions the report's ``reported_tcb``. The product comes from the VCEK's
product-name extension unless the caller names one; a chain the evidence brings must be that
product's pinned one.
"""

from __future__ import annotations

import contextlib
import datetime
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from hetero.sandbox.attestation.common import (
    AttestationError,
    RefusedError,
    Verdict,
    all_certificates,
    der_value,
    extension_bytes,
    load_certificates,
    pinned,
    require_valid,
    verify_ecdsa_raw,
    verify_issued,
)

__all__ = ["PRODUCTS", "SnpReport", "parse_report", "verify_sev_snp"]

REPORT_BYTES = 0x4A0
SIGNED_BYTES = 0x2A0
PRODUCTS = ("milan", "genoa", "turin")
DEBUG_POLICY_BIT = 19
_OID_PRODUCT = "1.3.6.1.4.1.3704.1.2"
_OID_HWID = "1.3.6.1.4.1.3704.1.4"
_OID_SPL = {  # the VCEK's TCB extensions
    "fmc": "1.3.6.1.4.1.3704.1.3.9",
    "bl": "1.3.6.1.4.1.3704.1.3.1",
    "tee": "1.3.6.1.4.1.3704.1.3.2",
    "snp": "1.3.6.1.4.1.3704.1.3.3",
    "ucode": "1.3.6.1.4.1.3704.1.3.8",
}


@dataclass(frozen=True, slots=True)
class SnpReport:
    """The fields of a report this verifier reads."""

    raw: bytes
    version: int
    policy: int
    signing_key: int  # 0 VCEK, 1 VLEK
    report_data: bytes
    measurement: bytes
    id_key_digest: bytes
    reported_tcb: bytes
    chip_id: bytes

    @property
    def debug(self) -> bool:
        return bool(self.policy >> DEBUG_POLICY_BIT & 1)


def parse_report(data: bytes) -> SnpReport:
    """A report from its 1184 bytes (or their hex text)."""
    text = data.strip()
    if len(text) == 2 * REPORT_BYTES:
        with contextlib.suppress(UnicodeDecodeError, ValueError):
            data = bytes.fromhex(text.decode("ascii"))
    if len(data) != REPORT_BYTES:
        raise AttestationError(f"an SEV-SNP report is {REPORT_BYTES} bytes, this is {len(data)}")
    version, _guest_svn, policy = struct.unpack_from("<IIQ", data, 0)
    if version not in (2, 3, 4, 5):
        raise AttestationError(f"SEV-SNP report version {version} is not supported")
    (algorithm,) = struct.unpack_from("<I", data, 0x34)
    if algorithm != 1:
        raise AttestationError(f"signature algorithm {algorithm} is not ECDSA P-384 with SHA-384")
    (flags,) = struct.unpack_from("<I", data, 0x48)
    return SnpReport(
        raw=data,
        version=version,
        policy=policy,
        signing_key=(flags >> 2) & 0b111,
        report_data=data[0x50:0x90],
        measurement=data[0x90:0xC0],
        id_key_digest=data[0xE0:0x110],
        reported_tcb=data[0x180:0x188],
        chip_id=data[0x1A0:0x1E0],
    )


def tcb_parts(tcb: bytes, product: str) -> dict[str, int]:
    """A TCB_VERSION's security patch levels (Turin lays them out differently)."""
    if product == "turin":
        return {"fmc": tcb[0], "bl": tcb[1], "tee": tcb[2], "snp": tcb[3], "ucode": tcb[7]}
    return {"bl": tcb[0], "tee": tcb[1], "snp": tcb[6], "ucode": tcb[7]}


Roots = Mapping[str, bytes]


def _pinned_chain(
    product: str, roots: Roots | None = None
) -> tuple[x509.Certificate, x509.Certificate, x509.Certificate]:
    pem = pinned(f"amd_{product}.pem") if roots is None else roots[product]
    ask, ark, asvk = load_certificates(pem, f"pinned AMD {product}")
    return ask, ark, asvk


def _product_of(leaf: x509.Certificate) -> str | None:
    raw = extension_bytes(leaf, _OID_PRODUCT)
    if raw is None:
        return None
    try:
        _, name = der_value(raw)
    except AttestationError:
        name = raw
    base = name.decode("ascii", "replace").split("-")[0].lower()
    return base if base in PRODUCTS else None


def _der_int(raw: bytes | None) -> int | None:
    if raw is None:
        return None
    tag, content = der_value(raw)
    if tag != 0x02:
        raise AttestationError("a VCEK TCB extension is not an INTEGER")
    return int.from_bytes(content, "big", signed=True)


def _hardware_id(leaf: x509.Certificate) -> bytes | None:
    raw = extension_bytes(leaf, _OID_HWID)
    if raw is None:
        return None
    if len(raw) in (8, 64):  # some VCEKs hold the id bare, others as an OCTET STRING
        return raw
    tag, content = der_value(raw)
    return content if tag == 0x04 else raw


def _check_given_chain(
    given: Sequence[x509.Certificate], product: str, roots: Roots | None
) -> None:
    """Certificates the evidence brought besides its leaf must be the product's pinned ones."""
    own = _pinned_chain(product, roots)
    others = {
        p: _pinned_chain(p, roots)
        for p in PRODUCTS
        if p != product and (roots is None or p in roots)
    }
    for certificate in given:
        if certificate in own:
            continue
        for other, chain in others.items():
            if certificate in chain:
                raise RefusedError(
                    f"the chain given is AMD {other.capitalize()}'s "
                    f"({certificate.subject.rfc4514_string()}), the report is from "
                    f"{product.capitalize()}"
                )
        raise RefusedError(
            f"certificate {certificate.subject.rfc4514_string()} is not a pinned AMD key "
            "(only the VCEK or VLEK comes with the evidence; the roots are pinned)"
        )


def endorse(
    certs: Sequence[bytes],
    as_of: datetime.datetime,
    product: str | None,
    roots: Roots | None = None,
) -> tuple[x509.Certificate, str]:
    """The VCEK or VLEK the evidence brought, checked to the product's pinned ARK at
    ``as_of``, and the product; the per-chip part a cache may keep. ``roots`` (product to
    ASK, ARK and ASVK PEM) replaces the pinned roots: only a simulated TEE in tests sets it."""
    if not certs:
        raise AttestationError("SEV-SNP evidence needs its VCEK or VLEK (--certs)")
    found = all_certificates(certs, "certificate")
    leaves = [c for c in found if "SEV-VCEK" in _cn(c) or "SEV-VLEK" in _cn(c)]
    if len(leaves) != 1:
        raise AttestationError("give exactly one VCEK or VLEK with the evidence")
    leaf = leaves[0]
    named = _product_of(leaf)
    chosen = product or named
    if chosen is None:
        raise AttestationError("the VCEK names no product: give one (milan, genoa, turin)")
    if chosen not in PRODUCTS:
        raise AttestationError(f"unknown AMD product {chosen!r} (known: {', '.join(PRODUCTS)})")
    if roots is not None and chosen not in roots:
        raise RefusedError(f"no roots given for AMD {chosen}")
    _check_given_chain([c for c in found if c is not leaf], chosen, roots)
    ask, ark, asvk = _pinned_chain(chosen, roots)
    vlek = "SEV-VLEK" in _cn(leaf)
    signer, signer_name = (asvk, "ASVK") if vlek else (ask, "ASK")
    label = f"AMD {chosen.capitalize()}"
    verify_issued(ark, ark, f"the {label} ARK", "itself")
    verify_issued(signer, ark, f"the {label} {signer_name}", f"the pinned {label} ARK")
    leaf_name = "VLEK" if vlek else "VCEK"
    verify_issued(leaf, signer, f"the {leaf_name}", f"the {label} {signer_name}")
    for certificate, what in ((ark, "ARK"), (signer, signer_name), (leaf, leaf_name)):
        require_valid(certificate, as_of, f"the {label} {what}")
    return leaf, chosen


def _cn(certificate: x509.Certificate) -> str:
    return certificate.subject.rfc4514_string()


def verify_sev_snp(
    evidence: bytes,
    certs: Sequence[bytes],
    as_of: datetime.datetime,
    *,
    product: str | None = None,
    endorsed: tuple[x509.Certificate, str] | None = None,
) -> Verdict:
    """Verify an SNP report; :class:`RefusedError` with the reason when any check fails.

    Args:
        evidence: The report (binary or hex text).
        certs: The VCEK or VLEK (DER or PEM); the ASK/ARK, if given, must be the pinned ones.
        as_of: The date certificates are judged at.
        product: ``milan``, ``genoa`` or ``turin``; the VCEK's own product name otherwise.
        endorsed: :func:`endorse`'s answer for these certificates, from a cache.
    """
    report = parse_report(evidence)
    leaf, chosen = endorsed or endorse(certs, as_of, product)
    vlek = "SEV-VLEK" in _cn(leaf)
    if report.signing_key != (1 if vlek else 0):
        wanted = "VLEK" if report.signing_key == 1 else "VCEK"
        raise RefusedError(
            f"the report is signed with a {wanted}, the certificate given is not one"
        )
    parts = tcb_parts(report.reported_tcb, chosen)
    facts = Verdict(
        "sev-snp",
        False,
        "Refused",
        measurement=report.measurement.hex(),
        chip=report.chip_id.hex(),
        tcb=" ".join(f"{name}={value}" for name, value in parts.items()),
        debug=report.debug,
        report_data=report.report_data,
        signer=report.id_key_digest.hex(),
        tcb_parts=tuple(parts.items()),
    )
    r = int.from_bytes(report.raw[SIGNED_BYTES : SIGNED_BYTES + 72], "little")
    s = int.from_bytes(report.raw[SIGNED_BYTES + 72 : SIGNED_BYTES + 144], "little")
    try:
        if not vlek:
            hardware_id = _hardware_id(leaf)
            if hardware_id is not None and report.chip_id[: len(hardware_id)] != hardware_id:
                raise RefusedError(
                    "the VCEK is another chip's (its hardware id is not the chip_id)"
                )
        verify_ecdsa_raw(
            leaf.public_key(),
            r,
            s,
            report.raw[:SIGNED_BYTES],
            hashes.SHA384(),
            f"the report against the {'VLEK' if vlek else 'VCEK'} given",
        )
        for name, value in parts.items():
            certified = _der_int(extension_bytes(leaf, _OID_SPL[name]))
            if certified is not None and certified != value:
                raise RefusedError(
                    f"the report's TCB {name}={value} is not the certificate's {name}={certified}"
                )
    except RefusedError as refusal:
        return facts.refused(refusal.reason)
    return Verdict(
        "sev-snp",
        True,
        "OK",
        measurement=facts.measurement,
        chip=facts.chip,
        tcb=facts.tcb,
        debug=facts.debug,
        report_data=facts.report_data,
        signer=facts.signer,
        tcb_parts=facts.tcb_parts,
    )
