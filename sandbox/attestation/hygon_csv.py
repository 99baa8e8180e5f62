"""Hygon CSV (China Secure Virtualization) attestation reports, version 1, verified offline.

Chain: the pinned Hygon Root Key (HRK, self-signed) signs the HSK, the HSK signs the chip's CEK,
the CEK signs the platform's PEK, the PEK signs the report. Certificates and report are Hygon's
binary structures (little-endian); every signature is SM2 over SM3 with the signer's user id.
The report's guest fields, its PEK and the chip serial number are XORed with a firmware nonce
(``anonce``) before use; an HMAC-SM3 keyed with the guest's ``mnonce`` protects the PEK and
serial number. The chip's serial number must be the one the CEK's chain belongs to only in
Hygon's key server, so it is reported, not checked; the CEK is tied to the report through the
PEK's signature.

SM2 point arithmetic comes from ``gmssl`` (BSD, pure Python; ``cryptography`` has SM3 and HMAC
but no SM2 signatures); the SM3 digests, the user-id hash Z and the HMAC are computed here with
``cryptography``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes, hmac

from hetero.sandbox.attestation.common import AttestationError, RefusedError, Verdict, pinned

__all__ = ["verify_csv"]

CA_CERT_BYTES = 832
CA_BODY_BYTES = 576
CSV_CERT_BYTES = 2084
CSV_BODY_BYTES = 1044
TEE_INFO_BYTES = 0x150
REPORT_BYTES = TEE_INFO_BYTES + CSV_CERT_BYTES + 64 + 32 + 32
SIGNED_TEE_INFO_BYTES = 180
USAGE_HRK, USAGE_HSK, USAGE_CEK, USAGE_PEK = 0x0000, 0x0013, 0x1004, 0x1002
# GB/T 32918.5 curve parameters (the SM2 curve)
SM2_P = 0xFFFFFFFEFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF00000000FFFFFFFFFFFFFFFF
SM2_A = 0xFFFFFFFEFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF00000000FFFFFFFFFFFFFFFC
SM2_B = 0x28E9FA9E9D9F5E344D5A9E4BCF6509A7F39789F515AB8F92DDBCBD414D940E93
SM2_N = 0xFFFFFFFEFFFFFFFFFFFFFFFFFFFFFFFF7203DF6B21C6052B53BBF40939D54123
SM2_GX = 0x32C4AE2C1F1981195F9904466A39C9948FE30BBFF2660BE1715A4589334C74C7
SM2_GY = 0xBC3736A2F4F6779C59BDCEE36B692153D0A9877CC62A474002DF32E52139F0A0


@dataclass(frozen=True, slots=True)
class _Key:
    """An SM2 public key with the user id signatures by it are bound to."""

    x: int
    y: int
    user_id: bytes
    usage: int
    name: str


def _sm3(*parts: bytes) -> bytes:
    digest = hashes.Hash(hashes.SM3())
    for part in parts:
        digest.update(part)
    return digest.finalize()


def _int32(value: int) -> bytes:
    return value.to_bytes(32, "big")


def _le_coordinate(raw: bytes) -> int:
    return int.from_bytes(raw[:32], "little")


def sm2_verify(key: _Key, message: bytes, r: int, s: int) -> bool:
    """Whether (r, s) is ``key``'s SM2 signature of ``message`` (GB/T 32918.2)."""
    from gmssl.sm2 import CryptSM2

    if not (0 < r < SM2_N and 0 < s < SM2_N):
        return False
    z = _sm3(
        (8 * len(key.user_id)).to_bytes(2, "big"),
        key.user_id,
        *(_int32(v) for v in (SM2_A, SM2_B, SM2_GX, SM2_GY, key.x, key.y)),
    )
    digest = _sm3(z, message)
    public = f"{key.x:064x}{key.y:064x}"
    verifier = CryptSM2(private_key=None, public_key=public)
    return bool(verifier.verify(f"{r:064x}{s:064x}", digest))


def _ca_certificate(data: bytes, name: str) -> tuple[_Key, bytes, bytes, int, int]:
    """(key, kid, sid, r, s) of an HRK or HSK certificate."""
    if len(data) != CA_CERT_BYTES:
        raise AttestationError(f"the {name} certificate is {len(data)} bytes, not {CA_CERT_BYTES}")
    kid, sid = data[4:20], data[20:36]
    (usage,) = struct.unpack_from("<I", data, 36)
    (uid_size,) = struct.unpack_from("<H", data, 212)
    if uid_size > 254:
        raise AttestationError(f"the {name} certificate's user id is too long")
    key = _Key(
        _le_coordinate(data[68:140]),
        _le_coordinate(data[140:212]),
        data[214 : 214 + uid_size],
        usage,
        name,
    )
    r = _le_coordinate(data[CA_BODY_BYTES : CA_BODY_BYTES + 72])
    s = _le_coordinate(data[CA_BODY_BYTES + 72 : CA_BODY_BYTES + 144])
    return key, kid, sid, r, s


def _csv_certificate(data: bytes, name: str) -> tuple[_Key, list[tuple[int, int, int]]]:
    """(key, [(usage, r, s), ...]) of a CEK or PEK certificate."""
    if len(data) != CSV_CERT_BYTES:
        raise AttestationError(f"the {name} certificate is {len(data)} bytes, not {CSV_CERT_BYTES}")
    (usage,) = struct.unpack_from("<I", data, 8)
    (uid_size,) = struct.unpack_from("<H", data, 164)
    if uid_size > 254:
        raise AttestationError(f"the {name} certificate's user id is too long")
    key = _Key(
        _le_coordinate(data[20:92]),
        _le_coordinate(data[92:164]),
        data[166 : 166 + uid_size],
        usage,
        name,
    )
    signatures = []
    for offset in (CSV_BODY_BYTES, CSV_BODY_BYTES + 520):
        (sig_usage,) = struct.unpack_from("<I", data, offset)
        r = _le_coordinate(data[offset + 8 : offset + 80])
        s = _le_coordinate(data[offset + 80 : offset + 152])
        signatures.append((sig_usage, r, s))
    return key, signatures


def _signed_by(
    signer: _Key, body: bytes, signatures: Sequence[tuple[int, int, int]], what: str
) -> None:
    for usage, r, s in signatures:
        if usage == signer.usage and sm2_verify(signer, body, r, s):
            return
    raise RefusedError(f"the {what} is not signed by the {signer.name}")


def _xor(data: bytes, anonce: int) -> bytes:
    mask = anonce.to_bytes(4, "little")
    return bytes(value ^ mask[index % 4] for index, value in enumerate(data))


def endorse(certs: Sequence[bytes]) -> _Key:
    """The chip's CEK, checked through the HSK to the pinned HRK."""
    blob = b"".join(certs)
    if len(blob) != CA_CERT_BYTES + CSV_CERT_BYTES:
        raise AttestationError(
            "Hygon CSV evidence needs the chip's HSK and CEK certificates (--certs, "
            f"{CA_CERT_BYTES} + {CSV_CERT_BYTES} bytes, as in hsk_cek.cert)"
        )
    hrk, hrk_kid, _, hrk_r, hrk_s = _ca_certificate(pinned("hygon_hrk.cert"), "pinned HRK")
    if not sm2_verify(hrk, pinned("hygon_hrk.cert")[:CA_BODY_BYTES], hrk_r, hrk_s):
        raise RefusedError("the pinned HRK's self-signature does not verify")
    hsk_data = blob[:CA_CERT_BYTES]
    hsk, hsk_kid, hsk_sid, r, s = _ca_certificate(hsk_data, "HSK")
    if hsk_sid != hrk_kid or not sm2_verify(hrk, hsk_data[:CA_BODY_BYTES], r, s):
        raise RefusedError("the HSK is not signed by the pinned Hygon root key (HRK)")
    if hsk.usage != USAGE_HSK:
        raise RefusedError("the first certificate given is not an HSK")
    cek_data = blob[CA_CERT_BYTES:]
    cek, signatures = _csv_certificate(cek_data, "CEK")
    if cek.usage != USAGE_CEK or cek_data[420:436] != hsk_kid:
        raise RefusedError("the second certificate given is not a CEK issued under this HSK")
    if not any(sm2_verify(hsk, cek_data[:CSV_BODY_BYTES], r, s) for _, r, s in signatures):
        raise RefusedError("the CEK is not signed by the HSK")
    return cek


def verify_csv(evidence: bytes, certs: Sequence[bytes], *, endorsed: _Key | None = None) -> Verdict:
    """Verify a CSV v1 report (its first 2548 bytes; padding to 4096 is allowed)."""
    if len(evidence) < REPORT_BYTES:
        raise AttestationError(
            f"a CSV report is at least {REPORT_BYTES} bytes, this is {len(evidence)}"
        )
    report = evidence[:REPORT_BYTES]
    cek = endorsed or endorse(certs)
    (anonce,) = struct.unpack_from("<I", report, 188)
    pek_data = _xor(report[TEE_INFO_BYTES : TEE_INFO_BYTES + CSV_CERT_BYTES], anonce)
    serial = _xor(
        report[TEE_INFO_BYTES + CSV_CERT_BYTES : TEE_INFO_BYTES + CSV_CERT_BYTES + 64], anonce
    )
    mnonce = _xor(report[128:144], anonce)
    mac_offset = TEE_INFO_BYTES + CSV_CERT_BYTES + 64 + 32
    code = hmac.HMAC(mnonce, hashes.SM3())
    code.update(report[TEE_INFO_BYTES:mac_offset])
    if code.finalize() != report[mac_offset : mac_offset + 32]:
        raise RefusedError("the report's PEK and serial number fail their HMAC (altered)")
    pek, signatures = _csv_certificate(pek_data, "PEK")
    if pek.usage != USAGE_PEK:
        raise RefusedError("the report's signing certificate is not a PEK")
    _signed_by(cek, pek_data[:CSV_BODY_BYTES], signatures, "PEK")
    r = _le_coordinate(report[192:264])
    s = _le_coordinate(report[264:336])
    policy = struct.unpack_from("<I", report, 176)[0] ^ anonce
    measurement = _xor(report[144:176], anonce)
    facts = Verdict(
        "csv",
        False,
        "Refused",
        measurement=measurement.hex(),
        chip=serial.rstrip(b"\0").decode("ascii", "replace"),
        tcb=f"policy={policy:#010x}",
        debug=not policy & 1,  # NODBG clear: the host may debug the guest
        report_data=_xor(report[64:128], anonce),
    )
    if not sm2_verify(pek, report[:SIGNED_TEE_INFO_BYTES], r, s):
        return facts.refused("the report is not signed by its PEK (altered report)")
    return Verdict(
        "csv",
        True,
        "OK",
        measurement=facts.measurement,
        chip=facts.chip,
        tcb=facts.tcb,
        debug=facts.debug,
        report_data=facts.report_data,
    )
