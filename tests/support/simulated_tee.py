"""A SIMULATED AMD SEV-SNP platform, for tests only.

It is not AMD hardware and its roots are not AMD's: it makes its own ARK, ASK, ASVK and VCEK
(same algorithms, extensions and layout as AMD's) and signs reports in the real 1184-byte
format with whatever report data the test asks for, which real evidence (fixed bytes from real
chips) cannot carry. The verifier accepts it only when a test passes its ``roots`` explicitly
(``amd_roots=``); no policy key or CLI flag can name it.
"""

from __future__ import annotations

import datetime
import os
import struct

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)
START = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
END = datetime.datetime(2045, 1, 1, tzinfo=datetime.UTC)


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "SIMULATED TEE (tests only)"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def _certificate(
    subject: str,
    issuer: str,
    public_key: object,
    signer: rsa.RSAPrivateKey,
    extensions: tuple[x509.UnrecognizedExtension, ...] = (),
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(START)
        .not_valid_after(END)
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    return builder.sign(signer, hashes.SHA384(), rsa_padding=PSS)


def _spl(oid: str, value: int) -> x509.UnrecognizedExtension:
    return x509.UnrecognizedExtension(x509.ObjectIdentifier(oid), bytes([0x02, 0x01, value]))


class SimulatedSnpTee:
    """One simulated Milan chip with its VCEK, signing reports on request."""

    def __init__(self, tcb: tuple[int, int, int, int] = (3, 0, 8, 115)) -> None:
        ark_key = rsa.generate_private_key(65537, 2048)
        ask_key = rsa.generate_private_key(65537, 2048)
        self.ark = _certificate("ARK-Milan", "ARK-Milan", ark_key.public_key(), ark_key)
        self.ask = _certificate("SEV-Milan", "ARK-Milan", ask_key.public_key(), ark_key)
        self.asvk = _certificate("SEV-VLEK-Milan", "ARK-Milan", ask_key.public_key(), ark_key)
        self.chip_id = os.urandom(64)
        self.tcb = bytes([tcb[0], tcb[1], 0, 0, 0, 0, tcb[2], tcb[3]])
        self._vcek_key = ec.generate_private_key(ec.SECP384R1())
        extensions = (
            x509.UnrecognizedExtension(
                x509.ObjectIdentifier("1.3.6.1.4.1.3704.1.2"), b"\x16\x08Milan-B0"
            ),
            x509.UnrecognizedExtension(x509.ObjectIdentifier("1.3.6.1.4.1.3704.1.4"), self.chip_id),
            _spl("1.3.6.1.4.1.3704.1.3.1", tcb[0]),
            _spl("1.3.6.1.4.1.3704.1.3.2", tcb[1]),
            _spl("1.3.6.1.4.1.3704.1.3.3", tcb[2]),
            _spl("1.3.6.1.4.1.3704.1.3.8", tcb[3]),
        )
        self.vcek = _certificate(
            "SEV-VCEK", "SEV-Milan", self._vcek_key.public_key(), ask_key, extensions
        )

    @property
    def roots(self) -> dict[str, bytes]:
        """The simulated ASK, ARK and ASVK, in the order of the pinned files."""
        pem = b"".join(
            c.public_bytes(serialization.Encoding.PEM) for c in (self.ask, self.ark, self.asvk)
        )
        return {"milan": pem}

    @property
    def vcek_der(self) -> bytes:
        return self.vcek.public_bytes(serialization.Encoding.DER)

    def report(self, report_data: bytes, measurement: bytes, *, debug: bool = False) -> bytes:
        """A signed report carrying ``report_data`` (64 bytes) and ``measurement`` (48)."""
        raw = bytearray(0x4A0)
        policy = 0x30000 | (1 << 19 if debug else 0)
        struct.pack_into("<IIQ", raw, 0, 2, 0, policy)
        struct.pack_into("<I", raw, 0x34, 1)
        raw[0x50:0x90] = report_data.ljust(64, b"\0")
        raw[0x90:0xC0] = measurement
        raw[0x180:0x188] = self.tcb
        raw[0x1A0:0x1E0] = self.chip_id
        signature = self._vcek_key.sign(bytes(raw[:0x2A0]), ec.ECDSA(hashes.SHA384()))
        r, s = decode_dss_signature(signature)
        raw[0x2A0:0x2E8] = r.to_bytes(72, "little")
        raw[0x2E8:0x330] = s.to_bytes(72, "little")
        return bytes(raw)
