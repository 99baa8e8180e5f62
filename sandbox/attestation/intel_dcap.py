"""Intel SGX and TDX ECDSA quotes (DCAP, quote versions 3 and 4), verified offline.

The quote carries the PCK certificate chain; the collateral (JSON, as Intel's PCS/PCCS serve it:
``pck_crl``, ``root_ca_crl``, ``tcb_info`` with its signature, ``qe_identity`` with its
signature, and their issuer chains) says what the platform's TCB is worth on a date. Checks:
the PCK chain up to the pinned Intel SGX Root CA, both CRLs (signature, window, serials), the QE
report signed by the PCK key and binding the attestation key (SHA-256 of key and QE auth data),
the quote signed by that attestation key, the TCB info and QE identity signed by the TCB signing
certificate and inside their validity windows, the FMSPC and PCE id, the QE's identity, and the
TCB level from the PCK's SGX components, PCE SVN and (TDX) the TEE TCB SVN and TDX module.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from hetero.sandbox.attestation.common import (
    AttestationError,
    RefusedError,
    Verdict,
    der_items,
    extension_bytes,
    load_certificates,
    pinned,
    require_valid,
    verify_ecdsa_raw,
    verify_issued,
)

__all__ = ["Quote", "parse_quote", "verify_dcap"]

TEE_SGX, TEE_TDX = 0x00000000, 0x00000081
HEADER_BYTES = 48
SGX_BODY_BYTES = 384
TDX_BODY_BYTES = 584
QE_REPORT_BYTES = 384
CERT_PCK_CHAIN, CERT_QE_REPORT = 5, 6
_SGX_EXTENSIONS = "1.2.840.113741.1.13.1"
# the worst of several statuses wins; Revoked is refused outright
STATUS_ORDER = (
    "UpToDate",
    "SWHardeningNeeded",
    "ConfigurationNeeded",
    "ConfigurationAndSWHardeningNeeded",
    "OutOfDate",
    "OutOfDateConfigurationNeeded",
    "Revoked",
)


@dataclass(frozen=True, slots=True)
class Quote:
    """The fields of a quote this verifier reads."""

    version: int
    tee: str  # "sgx" or "tdx"
    signed: bytes  # header and body
    body: bytes
    signature: bytes
    attestation_key: bytes
    qe_report: bytes
    qe_report_signature: bytes
    qe_auth_data: bytes
    pck_chain: bytes

    @property
    def report_data(self) -> bytes:
        return self.body[520:584] if self.tee == "tdx" else self.body[320:384]

    @property
    def measurement(self) -> bytes:
        """SGX: MRENCLAVE. TDX: MRTD (the TD's firmware) followed by RTMR0-3 (what it booted:
        kernel, initrd, command line, and what the guest extended), so a policy that pins it
        pins the guest, not only the firmware any guest could boot with."""
        if self.tee == "tdx":
            return self.body[136:184] + self.body[328:520]
        return self.body[64:96]

    @property
    def signer(self) -> bytes:
        return b"" if self.tee == "tdx" else self.body[128:160]

    @property
    def debug(self) -> bool:
        if self.tee == "tdx":
            return bool(self.body[120] & 0x01)  # TD_ATTRIBUTES.DEBUG
        return bool(self.body[48] & 0x02)  # ATTRIBUTES.DEBUG


class _Reader:
    def __init__(self, data: bytes, offset: int) -> None:
        self.data, self.offset = data, offset

    def take(self, count: int, what: str) -> bytes:
        if self.offset + count > len(self.data):
            raise AttestationError(f"quote truncated in its {what}")
        chunk = self.data[self.offset : self.offset + count]
        self.offset += count
        return chunk

    def u16(self, what: str) -> int:
        return int(struct.unpack("<H", self.take(2, what))[0])

    def u32(self, what: str) -> int:
        return int(struct.unpack("<I", self.take(4, what))[0])


def parse_quote(data: bytes) -> Quote:
    """A version 3 (SGX) or 4 (SGX or TDX) ECDSA P-256 quote."""
    if len(data) < HEADER_BYTES:
        raise AttestationError("too short for a DCAP quote")
    version, key_type, tee_type = struct.unpack_from("<HHI", data, 0)
    if version not in (3, 4):
        raise AttestationError(f"DCAP quote version {version} is not supported (3 or 4)")
    if key_type != 2:
        raise AttestationError(f"attestation key type {key_type} is not ECDSA P-256")
    if tee_type not in (TEE_SGX, TEE_TDX):
        raise AttestationError(f"unknown TEE type {tee_type:#x}")
    tee = "tdx" if tee_type == TEE_TDX else "sgx"
    body_bytes = TDX_BODY_BYTES if tee == "tdx" else SGX_BODY_BYTES
    reader = _Reader(data, HEADER_BYTES)
    body = reader.take(body_bytes, "report body")
    signed = data[: reader.offset]
    length = reader.u32("signature length")
    end = reader.offset + length
    if end > len(data):
        raise AttestationError("quote truncated in its signature data")
    signature = reader.take(64, "signature")
    attestation_key = reader.take(64, "attestation key")
    if version == 4:
        cert_type, _size = reader.u16("certification type"), reader.u32("certification size")
        if cert_type != CERT_QE_REPORT:
            raise AttestationError(f"certification data type {cert_type} is not a QE report")
    qe_report = reader.take(QE_REPORT_BYTES, "QE report")
    qe_report_signature = reader.take(64, "QE report signature")
    qe_auth_data = reader.take(reader.u16("QE auth data size"), "QE auth data")
    cert_type, size = reader.u16("certification type"), reader.u32("certification size")
    if cert_type != CERT_PCK_CHAIN:
        raise AttestationError(f"certification data type {cert_type} is not a PCK chain")
    pck_chain = reader.take(size, "PCK chain")
    return Quote(
        version,
        tee,
        signed,
        body,
        signature,
        attestation_key,
        qe_report,
        qe_report_signature,
        qe_auth_data,
        pck_chain,
    )


def _oid(content: bytes) -> str:
    first = content[0]
    parts = [first // 40, first % 40]
    value = 0
    for byte in content[1:]:
        value = value << 7 | byte & 0x7F
        if not byte & 0x80:
            parts.append(value)
            value = 0
    return ".".join(map(str, parts))


@dataclass(frozen=True, slots=True)
class PckFacts:
    """What the PCK certificate's SGX extension says about the platform."""

    ppid: bytes
    components: tuple[int, ...]
    pce_svn: int
    pce_id: bytes
    fmspc: bytes


def pck_facts(pck: x509.Certificate) -> PckFacts:
    """The SGX extension (OID 1.2.840.113741.1.13.1) of a PCK certificate."""
    raw = extension_bytes(pck, _SGX_EXTENSIONS)
    if raw is None:
        raise AttestationError("the PCK certificate has no SGX extension")
    ((_, sequence),) = der_items(raw)
    fields: dict[str, bytes] = {}
    for _, pair in der_items(sequence):
        (_, oid), (_, value) = list(der_items(pair))[:2]
        fields[_oid(oid)] = value
    components: dict[int, int] = {}
    pce_svn = -1
    for _, pair in der_items(fields.get(_SGX_EXTENSIONS + ".2", b"")):
        (_, oid), (_, value) = list(der_items(pair))[:2]
        index = int(_oid(oid).rsplit(".", 1)[1])
        if index <= 16:
            components[index] = int.from_bytes(value, "big")
        elif index == 17:
            pce_svn = int.from_bytes(value, "big")
    if len(components) != 16 or pce_svn < 0:
        raise AttestationError("the PCK certificate's TCB extension is incomplete")
    return PckFacts(
        fields.get(_SGX_EXTENSIONS + ".1", b""),
        tuple(components[i] for i in range(1, 17)),
        pce_svn,
        fields.get(_SGX_EXTENSIONS + ".3", b""),
        fields.get(_SGX_EXTENSIONS + ".4", b""),
    )


def _timestamp(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _crl(value: str, what: str) -> x509.CertificateRevocationList:
    text = value.strip()
    try:
        if text.startswith("-----BEGIN"):
            return x509.load_pem_x509_crl(text.encode())
        return x509.load_der_x509_crl(bytes.fromhex(text))
    except ValueError as err:
        raise AttestationError(f"collateral {what}: not a CRL ({err})") from None


def _check_crl(
    crl: x509.CertificateRevocationList,
    issuer: x509.Certificate,
    subject: x509.Certificate,
    as_of: datetime.datetime,
    what: str,
) -> None:
    if crl.issuer != issuer.subject or not crl.is_signature_valid(issuer.public_key()):  # type: ignore[arg-type]
        raise RefusedError(f"the {what} is not signed by {issuer.subject.rfc4514_string()}")
    next_update = crl.next_update_utc
    if as_of < crl.last_update_utc or (next_update is not None and as_of > next_update):
        until = f"{next_update:%Y-%m-%d}" if next_update else "open"
        raise RefusedError(
            f"the {what} is outside its window ({crl.last_update_utc:%Y-%m-%d} to {until})"
        )
    if crl.get_revoked_certificate_by_serial_number(subject.serial_number) is not None:
        raise RefusedError(f"{subject.subject.rfc4514_string()} is revoked by the {what}")


def _signed_collateral(
    collateral: dict[str, Any],
    name: str,
    root: x509.Certificate,
    root_crl: x509.CertificateRevocationList,
    as_of: datetime.datetime,
) -> dict[str, Any]:
    """``tcb_info`` or ``qe_identity``: signed by its issuer chain's leaf (itself issued by the
    pinned root) and inside its issue date and next update."""
    body = collateral.get(name)
    signature = collateral.get(f"{name}_signature")
    chain = collateral.get(f"{name}_issuer_chain")
    if not isinstance(body, str) or not isinstance(signature, str) or not isinstance(chain, str):
        raise AttestationError(f"collateral has no {name}, {name}_signature or issuer chain")
    signer = load_certificates(chain.encode(), f"{name}_issuer_chain")[0]
    what = f"the {name.replace('_', ' ')} signing certificate"
    verify_issued(signer, root, what, "the pinned Intel SGX Root CA")
    require_valid(signer, as_of, what)
    _check_crl(root_crl, root, signer, as_of, "root CA CRL")
    raw = bytes.fromhex(signature)
    if len(raw) != 64:
        raise AttestationError(f"{name}_signature is not 64 bytes")
    verify_ecdsa_raw(
        signer.public_key(),
        int.from_bytes(raw[:32], "big"),
        int.from_bytes(raw[32:], "big"),
        body.encode(),
        hashes.SHA256(),
        f"the {name.replace('_', ' ')}",
    )
    value = json.loads(body)
    if not isinstance(value, dict):
        raise AttestationError(f"collateral {name} is not a JSON object")
    issued, next_update = _timestamp(value["issueDate"]), _timestamp(value["nextUpdate"])
    if not issued <= as_of <= next_update:
        raise RefusedError(
            f"the {name.replace('_', ' ')} collateral is outside its window "
            f"({issued:%Y-%m-%d} to {next_update:%Y-%m-%d})"
        )
    return value


def _worst(*statuses: str) -> str:
    return max(statuses, key=lambda s: STATUS_ORDER.index(s) if s in STATUS_ORDER else 0)


def _qe_status(quote: Quote, identity: dict[str, Any]) -> str:
    report = quote.qe_report

    def masked(value: bytes, mask: bytes) -> bytes:
        return bytes(a & b for a, b in zip(value, mask, strict=True))

    miscselect, attributes = report[16:20], report[48:64]
    if masked(miscselect, bytes.fromhex(identity["miscselectMask"])) != bytes.fromhex(
        identity["miscselect"]
    ) or masked(attributes, bytes.fromhex(identity["attributesMask"])) != bytes.fromhex(
        identity["attributes"]
    ):
        raise RefusedError("the quoting enclave's MISCSELECT or ATTRIBUTES are not Intel's")
    if report[128:160] != bytes.fromhex(identity["mrsigner"]):
        raise RefusedError("the quoting enclave is not signed by Intel (MRSIGNER differs)")
    (prod_id, isv_svn) = struct.unpack_from("<HH", report, 256)
    if prod_id != identity["isvprodid"]:
        raise RefusedError("the quoting enclave's product id is not Intel's")
    for level in identity["tcbLevels"]:
        if isv_svn >= level["tcb"]["isvsvn"]:
            return str(level["tcbStatus"])
    raise RefusedError(f"the quoting enclave's ISVSVN {isv_svn} matches no TCB level (Revoked)")


def _tdx_module_status(quote: Quote, tcb_info: dict[str, Any]) -> str:
    tee_tcb_svn = quote.body[0:16]
    major = tee_tcb_svn[1]
    if major == 0:
        return "UpToDate"
    identities = {m["id"]: m for m in tcb_info.get("tdxModuleIdentities", [])}
    module = identities.get(f"TDX_{major:02X}")
    if module is None:
        raise RefusedError(f"no TDX module identity TDX_{major:02X} in the TCB info")
    if quote.body[64:112] != bytes.fromhex(module["mrsigner"]):
        raise RefusedError("the TDX module is not signed by Intel (MRSIGNERSEAM differs)")
    for level in module["tcbLevels"]:
        if tee_tcb_svn[0] >= level["tcb"]["isvsvn"]:
            return str(level["tcbStatus"])
    raise RefusedError(f"the TDX module's SVN {tee_tcb_svn[0]} matches no TCB level")


def _platform_level(quote: Quote, pck: PckFacts, tcb_info: dict[str, Any]) -> dict[str, Any]:
    tee_tcb_svn = quote.body[0:16]
    for level in tcb_info["tcbLevels"]:
        tcb = level["tcb"]
        wanted = [c["svn"] for c in tcb["sgxtcbcomponents"]]
        if any(have < want for have, want in zip(pck.components, wanted, strict=True)):
            continue
        if pck.pce_svn < tcb["pcesvn"]:
            continue
        if quote.tee == "tdx":
            tdx = [c["svn"] for c in tcb["tdxtcbcomponents"]]
            start = 2 if tee_tcb_svn[1] > 0 else 0  # the module's own SVNs are checked apart
            if any(tee_tcb_svn[i] < tdx[i] for i in range(start, 16)):
                continue
        return dict(level)
    raise RefusedError(
        "the platform's TCB matches no level of the TCB info (TCB level not supported: "
        "stale TCB or collateral from another time)"
    )


def endorse(
    quote: Quote, collateral: dict[str, Any], as_of: datetime.datetime
) -> tuple[x509.Certificate, PckFacts, str, tuple[str, ...], str]:
    """The PCK key with its platform facts, the TCB status and advisories, and the TCB
    level's date: everything a cache may keep per platform, TCB and collateral."""
    root = load_certificates(pinned("intel_sgx_root_ca.der"), "pinned Intel SGX Root CA")[0]
    chain = load_certificates(quote.pck_chain, "the quote's PCK chain")
    if len(chain) < 2:
        raise RefusedError("the quote's PCK chain has no intermediate CA")
    pck, intermediate = chain[0], chain[1]
    if len(chain) > 2 and chain[-1] != root:
        raise RefusedError("the quote's PCK chain ends in a root that is not the pinned Intel root")
    verify_issued(root, root, "the pinned Intel SGX Root CA", "itself")
    verify_issued(intermediate, root, "the PCK CA", "the pinned Intel SGX Root CA")
    verify_issued(pck, intermediate, "the PCK certificate", "the PCK CA")
    for certificate, what in ((root, "Intel SGX Root CA"), (intermediate, "PCK CA")):
        require_valid(certificate, as_of, f"the {what}")
    require_valid(pck, as_of, "the PCK certificate")
    root_crl = _crl(str(collateral.get("root_ca_crl", "")), "root_ca_crl")
    pck_crl = _crl(str(collateral.get("pck_crl", "")), "pck_crl")
    _check_crl(root_crl, root, intermediate, as_of, "root CA CRL")
    _check_crl(pck_crl, intermediate, pck, as_of, "PCK CRL")
    tcb_info = _signed_collateral(collateral, "tcb_info", root, root_crl, as_of)
    identity = _signed_collateral(collateral, "qe_identity", root, root_crl, as_of)
    expected_id = "TDX" if quote.tee == "tdx" else "SGX"
    if tcb_info.get("id", "SGX") != expected_id:
        raise RefusedError(f"the TCB info is for {tcb_info.get('id')}, the quote is {expected_id}")
    facts = pck_facts(pck)
    if bytes.fromhex(tcb_info["fmspc"]) != facts.fmspc:
        raise RefusedError("the TCB info is for another platform (FMSPC differs)")
    if bytes.fromhex(tcb_info["pceId"]) != facts.pce_id:
        raise RefusedError("the TCB info is for another PCE (PCE id differs)")
    level = _platform_level(quote, facts, tcb_info)
    statuses = [str(level["tcbStatus"]), _qe_status(quote, identity)]
    if quote.tee == "tdx":
        statuses.append(_tdx_module_status(quote, tcb_info))
    status = _worst(*statuses)
    if status == "Revoked":
        raise RefusedError("the platform's TCB is revoked")
    advisories = tuple(str(a) for a in level.get("advisoryIDs", []))
    return pck, facts, status, advisories, str(level.get("tcbDate", ""))


def endorse_json(
    quote: Quote, collateral_json: bytes | None, as_of: datetime.datetime
) -> tuple[x509.Certificate, PckFacts, str, tuple[str, ...], str]:
    """:func:`endorse` with the collateral as its JSON file's bytes; what is missing,
    unreadable or malformed is an :class:`AttestationError` naming it."""
    if collateral_json is None:
        raise AttestationError("Intel quotes need their collateral (--collateral)")
    try:
        collateral = json.loads(collateral_json)
    except ValueError as err:
        raise AttestationError(f"collateral is not JSON ({err})") from None
    if not isinstance(collateral, dict):
        raise AttestationError("collateral is not a JSON object")
    try:
        return endorse(quote, collateral, as_of)
    except AttestationError:
        raise
    except (KeyError, TypeError, ValueError) as err:
        raise AttestationError(f"collateral is malformed ({type(err).__name__}: {err})") from None


def verify_dcap(
    evidence: bytes,
    collateral_json: bytes | None,
    as_of: datetime.datetime,
    *,
    tee: str,
    endorsed: tuple[x509.Certificate, PckFacts, str, tuple[str, ...], str] | None = None,
    certs: Sequence[bytes] = (),
) -> Verdict:
    """Verify an SGX or TDX quote against its collateral at ``as_of``; :class:`RefusedError` with
    the reason when a check fails. ``certs`` is unused: the PCK chain travels in the quote."""
    del certs
    quote = parse_quote(evidence)
    if quote.tee != tee:
        raise AttestationError(f"this is an {quote.tee.upper()} quote, not {tee.upper()}")
    if endorsed is None:
        endorsed = endorse_json(quote, collateral_json, as_of)
    pck, facts, status, advisories, _ = endorsed
    verify_ecdsa_raw(
        pck.public_key(),
        int.from_bytes(quote.qe_report_signature[:32], "big"),
        int.from_bytes(quote.qe_report_signature[32:], "big"),
        quote.qe_report,
        hashes.SHA256(),
        "the QE report against the PCK certificate",
    )
    bound = hashlib.sha256(quote.attestation_key + quote.qe_auth_data).digest()
    if quote.qe_report[320:352] != bound:
        raise RefusedError("the QE report does not bind the quote's attestation key")
    verify_ecdsa_raw(
        _p256_key(quote.attestation_key),
        int.from_bytes(quote.signature[:32], "big"),
        int.from_bytes(quote.signature[32:], "big"),
        quote.signed,
        hashes.SHA256(),
        "the quote",
    )
    tee_tcb = quote.body[0:16] if tee == "tdx" else b""
    return Verdict(
        tee,
        True,
        status,
        measurement=quote.measurement.hex(),
        chip=facts.ppid.hex() or facts.fmspc.hex(),
        tcb=f"fmspc={facts.fmspc.hex()} pcesvn={facts.pce_svn} "
        f"sgx={'.'.join(map(str, facts.components))}"
        + (f" tee_tcb_svn={tee_tcb.hex()}" if tee_tcb else ""),
        debug=quote.debug,
        report_data=quote.report_data,
        signer=quote.signer.hex(),
        advisories=advisories,
        tcb_parts=(("pcesvn", facts.pce_svn),),
    )


def _p256_key(raw: bytes) -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b"\x04" + raw)
    except ValueError:
        raise RefusedError("the quote's attestation key is not a P-256 point") from None
