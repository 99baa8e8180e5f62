"""Offline verification of hardware attestation evidence, one module per vendor.

``verify_evidence(kind, evidence, certs=..., collateral=..., as_of=...)`` checks AMD SEV-SNP
(:mod:`.sev_snp`), Intel TDX and SGX (:mod:`.intel_dcap`), Hygon CSV (:mod:`.hygon_csv`) and
NVIDIA Hopper GPU (:mod:`.nvidia`) evidence against the vendor roots pinned in ``roots/``, at a
given date, and optionally a nonce bound into the report data and a partition's measurement
policy (:mod:`.policy`). It never touches the network.

The chain and collateral checks (the part that depends only on the chip, its TCB and the
collateral) are kept in an :class:`EndorsementCache`, so a second sandbox on the same chip
pays only for the report's own signature; see ``benchmarks/attestation_verify.py``.
"""

from __future__ import annotations

import datetime
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hetero.framework.policy.schema import AttestationPolicy
from hetero.sandbox.attestation.common import (
    KINDS,
    AttestationError,
    RefusedError,
    Verdict,
    check_report_data,
)

__all__ = [
    "KINDS",
    "AttestationError",
    "EndorsementCache",
    "RefusedError",
    "Verdict",
    "as_of_date",
    "verify_evidence",
]


def as_of_date(text: str) -> datetime.datetime:
    """``YYYY-MM-DD`` as midnight UTC; ValueError otherwise."""
    day = datetime.date.fromisoformat(text)
    return datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC)


class EndorsementCache:
    """Chain and collateral results per chip, TCB and collateral, and the second they were
    checked at (an expiry is never outlived), bounded LRU.

    Only what does not depend on the report itself is kept: every report's own signature,
    nonce and measurement are checked each time.
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_make(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """The kept value for ``key``, else ``make()``'s (kept only when it did not raise)."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key]
        value = make()
        with self._lock:
            self.misses += 1
            self._entries[key] = value
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return value


def _digest(*parts: bytes) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(len(part).to_bytes(8, "big"))
        hasher.update(part)
    return hasher.hexdigest()


def _verify(
    kind: str,
    evidence: bytes,
    certs: Sequence[bytes],
    collateral: bytes | None,
    as_of: datetime.datetime,
    product: str | None,
    cache: EndorsementCache | None,
    amd_roots: Mapping[str, bytes] | None,
) -> Verdict:
    def cached(key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        return make() if cache is None else cache.get_or_make(key, make)

    # endorsements hold for the second they were checked at: certificates, CRLs and
    # collateral expire on a second, and one checked earlier must not outlive its end
    moment = as_of.replace(microsecond=0).isoformat()
    if kind == "sev-snp":
        from hetero.sandbox.attestation import sev_snp

        roots_key = None if amd_roots is None else _digest(*amd_roots.values())
        endorsed = cached(
            (kind, _digest(*certs), moment, product, roots_key),
            lambda: sev_snp.endorse(certs, as_of, product, amd_roots),
        )
        return sev_snp.verify_sev_snp(evidence, certs, as_of, product=product, endorsed=endorsed)
    if kind in ("tdx", "sgx"):
        from hetero.sandbox.attestation import intel_dcap

        quote = intel_dcap.parse_quote(evidence)
        if collateral is None:
            raise AttestationError("Intel quotes need their collateral (--collateral)")

        def make() -> Any:
            return intel_dcap.endorse_json(quote, collateral, as_of)

        # every byte endorse reads: the TDX module's identity (MRSEAM, MRSIGNERSEAM) included
        seam = quote.body[:136] if quote.tee == "tdx" else quote.body[:16]
        platform = quote.pck_chain + seam + quote.qe_report[:320]
        endorsed = cached((kind, _digest(platform, collateral), moment), make)
        return intel_dcap.verify_dcap(evidence, collateral, as_of, tee=kind, endorsed=endorsed)
    if kind == "nvidia":
        from hetero.sandbox.attestation import nvidia

        endorsed = cached((kind, _digest(*certs), moment), lambda: nvidia.endorse(certs, as_of))
        return nvidia.verify_nvidia(evidence, certs, as_of, endorsed=endorsed)
    if kind == "csv":
        from hetero.sandbox.attestation import hygon_csv

        endorsed = cached((kind, _digest(*certs)), lambda: hygon_csv.endorse(certs))
        return hygon_csv.verify_csv(evidence, certs, endorsed=endorsed)
    raise AttestationError(f"unknown evidence kind {kind!r} (known: {', '.join(KINDS)})")


def verify_evidence(
    kind: str,
    evidence: bytes,
    *,
    as_of: datetime.datetime,
    certs: Sequence[bytes] = (),
    collateral: bytes | None = None,
    report_data: bytes | None = None,
    product: str | None = None,
    policy: AttestationPolicy | None = None,
    partition: str = "",
    cache: EndorsementCache | None = None,
    amd_roots: Mapping[str, bytes] | None = None,
) -> Verdict:
    """Verify one piece of evidence; a refused :class:`Verdict` says why it is not trusted.

    Args:
        kind: ``sev-snp``, ``tdx``, ``sgx``, ``csv`` or ``nvidia``.
        evidence: The report or quote as the hardware produced it.
        as_of: The moment certificates, CRLs and collateral are judged at.
        certs: What comes with the evidence (VCEK or VLEK; the GPU's chain; HSK and CEK).
        collateral: Intel's collateral JSON (TDX and SGX).
        report_data: The nonce (or hash of nonce and key) the report must carry; shorter
            values are zero-padded to the report's field.
        product: The AMD product (``milan``, ``genoa``, ``turin``) the policy pins.
        policy: The partition's measurement policy; none checks the evidence only.
        partition: The partition's name, for reasons.
        cache: Where chain and collateral results are kept between calls.
        amd_roots: Replaces the pinned AMD roots (product to ASK, ARK and ASVK PEM). Only a
            simulated TEE in tests sets it; no policy key or CLI flag reaches it.

    Raises:
        AttestationError: The evidence, certificates or collateral cannot be read at all, or
            something needed was not given.
    """
    if product is None and policy is not None:
        product = policy.product
    try:
        verdict = _verify(kind, evidence, certs, collateral, as_of, product, cache, amd_roots)
    except RefusedError as refusal:
        return Verdict(kind, False, "Refused", reason=refusal.reason)
    if not verdict.verified:
        return verdict
    try:
        check_report_data(verdict.report_data, report_data)
    except RefusedError as refusal:
        return verdict.refused(refusal.reason)
    if policy is not None:
        from hetero.sandbox.attestation.policy import apply_policy

        return apply_policy(verdict, policy, partition)
    return verdict
