"""Attestation verification time per evidence kind, cold (every chain and collateral check)
against warm (the chip's chain and collateral kept in an ``EndorsementCache``; the report's
own signature, nonce and policy still checked), measured interleaved in one run.

Uses the real evidence in ``tests/data/attestation`` (a copy of ``../shared/data/attestation``;
its README). Prints the median of
each and their ratio; the warm figure is what a sandbox start on an already seen chip pays.

    .venv/bin/python benchmarks/attestation_verify.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hetero.sandbox.attestation import EndorsementCache, as_of_date, verify_evidence

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "attestation"
REPEATS = 30


def cases() -> dict[str, Callable[[EndorsementCache | None], bool]]:
    snp, tdx, sgx = DATA / "amd-sev-snp", DATA / "intel-tdx", DATA / "intel-sgx"
    gpu, csv = DATA / "nvidia-h100" / "nvtrust", DATA / "hygon-csv" / "csv-rs"

    def make(
        kind: str,
        evidence: Path,
        day: str,
        certs: tuple[Path, ...] = (),
        collateral: Path | None = None,
    ):
        raw, chain = evidence.read_bytes(), [c.read_bytes() for c in certs]
        extra = collateral.read_bytes() if collateral else None
        when = as_of_date(day)

        def run(cache: EndorsementCache | None) -> bool:
            verdict = verify_evidence(
                kind, raw, certs=chain, collateral=extra, as_of=when, cache=cache
            )
            return verdict.verified

        return run

    return {
        "sev-snp": make(
            "sev-snp",
            snp / "trustee/test-report.bin",
            "2025-06-01",
            (snp / "trustee/test-vcek.der",),
        ),
        "tdx": make(
            "tdx",
            tdx / "phala-dcap-qvl/tdx_quote",
            "2025-06-20",
            collateral=tdx / "phala-dcap-qvl/tdx_quote_collateral.json",
        ),
        "sgx": make(
            "sgx",
            sgx / "phala-dcap-qvl/sgx_quote",
            "2025-06-20",
            collateral=sgx / "phala-dcap-qvl/sgx_quote_collateral.json",
        ),
        "nvidia": make(
            "nvidia",
            gpu / "hopperAttestationReport.txt",
            "2025-06-01",
            (gpu / "hopperCertChain.txt",),
        ),
        "csv": make("csv", csv / "report.cert", "2025-06-01", (csv / "hsk_cek.cert",)),
    }


def main() -> int:
    if not DATA.is_dir():
        print(f"no evidence at {DATA}", file=sys.stderr)
        return 2
    print(f"{'kind':8} {'cold ms':>9} {'warm ms':>9} {'cold/warm':>10}")
    for kind, run in cases().items():
        cache = EndorsementCache()
        assert run(cache)  # fills the cache
        cold, warm = [], []
        for _ in range(REPEATS):
            start = time.perf_counter()
            assert run(None)
            cold.append(time.perf_counter() - start)
            start = time.perf_counter()
            assert run(cache)
            warm.append(time.perf_counter() - start)
        c, w = statistics.median(cold) * 1e3, statistics.median(warm) * 1e3
        print(f"{kind:8} {c:9.2f} {w:9.2f} {c / w:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
