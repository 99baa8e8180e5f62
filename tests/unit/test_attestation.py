"""Issue 37: offline attestation verification with real evidence from real hardware
(``tests/data/attestation``, a copy of ``../shared/data/attestation``; see its README for
sources and licences): each vendor's genuine evidence verifies at its
"as of" date, and each kind of bad evidence is refused with its reason."""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path

import pytest
from cryptography import x509

from hetero.framework.cli import main
from hetero.framework.policy.schema import AttestationPolicy
from hetero.sandbox.attestation import (
    AttestationError,
    EndorsementCache,
    Verdict,
    as_of_date,
    verify_evidence,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "attestation"
SNP = DATA / "amd-sev-snp"
TDX = DATA / "intel-tdx"
SGX = DATA / "intel-sgx" / "phala-dcap-qvl"
GPU = DATA / "nvidia-h100"
CSV = DATA / "hygon-csv" / "csv-rs"
AMD_DAY = as_of_date("2025-06-01")
INTEL_DAY = as_of_date("2025-06-20")
INTEL_2023 = as_of_date("2023-07-01")
AFTER_VLEK = as_of_date("2026-01-15")  # the VLEK expired on 2025-12-10


@pytest.fixture(scope="module", autouse=True)
def _evidence_present() -> None:
    if not DATA.is_dir():
        pytest.fail(f"the attestation evidence is not at {DATA}")


def read(path: Path) -> bytes:
    return path.read_bytes()


def flip(data: bytes, offset: int) -> bytes:
    changed = bytearray(data)
    changed[offset] ^= 0x01
    return bytes(changed)


def snp(report: str, *certs: str, as_of: str = "2025-06-01", **options: object) -> Verdict:
    return verify_evidence(
        "sev-snp",
        read(SNP / report),
        certs=[read(SNP / c) for c in certs],
        as_of=as_of_date(as_of),
        **options,  # type: ignore[arg-type]
    )


def go_tdx_collateral() -> bytes:
    """go-tdx-guest's 2023 PCS responses as one collateral JSON (the shape PCCS serves and
    Phala's samples use): the signed ``tcbInfo``/``enclaveIdentity`` bodies as sent."""
    folder = TDX / "go-tdx-guest"

    def body_and_signature(name: str, key: str) -> tuple[str, str]:
        text = (folder / name).read_text()
        start = text.index(f'{{"{key}":') + len(f'{{"{key}":')
        end = text.rindex(',"signature":"')
        return text[start:end], text[end + len(',"signature":"') :].split('"')[0]

    tcb_info, tcb_signature = body_and_signature("sample_tcbInfo_response", "tcbInfo")
    identity, identity_signature = body_and_signature(
        "sample_qeIdentity_response", "enclaveIdentity"
    )
    return json.dumps(
        {
            "pck_crl_issuer_chain": (folder / "pckCrlIssuerChain.pem").read_text(),
            "root_ca_crl": (folder / "rootcrl.der").read_bytes().hex(),
            "pck_crl": (folder / "pckcrl").read_bytes().hex(),
            "tcb_info_issuer_chain": (folder / "tcbInfoIssuerChain.pem").read_text(),
            "tcb_info": tcb_info,
            "tcb_info_signature": tcb_signature,
            "qe_identity_issuer_chain": (folder / "qeIdentityIssuerChain.pem").read_text(),
            "qe_identity": identity,
            "qe_identity_signature": identity_signature,
        }
    ).encode()


def tdx(evidence: bytes | None = None, as_of: str = "2025-06-20", **options: object) -> Verdict:
    folder = TDX / "phala-dcap-qvl"
    return verify_evidence(
        "tdx",
        evidence or read(folder / "tdx_quote"),
        collateral=read(folder / "tdx_quote_collateral.json"),
        as_of=as_of_date(as_of),
        **options,  # type: ignore[arg-type]
    )


def sgx(evidence: bytes | None = None, as_of: str = "2025-06-20", **options: object) -> Verdict:
    return verify_evidence(
        "sgx",
        evidence or read(SGX / "sgx_quote"),
        collateral=read(SGX / "sgx_quote_collateral.json"),
        as_of=as_of_date(as_of),
        **options,  # type: ignore[arg-type]
    )


def gpu(chain: str = "nvtrust/hopperCertChain.txt", evidence: bytes | None = None) -> Verdict:
    return verify_evidence(
        "nvidia",
        evidence or read(GPU / "nvtrust" / "hopperAttestationReport.txt"),
        certs=[read(GPU / chain)],
        as_of=AMD_DAY,
    )


def hygon(evidence: bytes | None = None, **options: object) -> Verdict:
    return verify_evidence(
        "csv",
        evidence or read(CSV / "report.cert"),
        certs=[read(CSV / "hsk_cek.cert")],
        as_of=AMD_DAY,
        **options,  # type: ignore[arg-type]
    )


# --- genuine evidence verifies -------------------------------------------------------------


@pytest.mark.parametrize(
    ("report", "certificate", "tcb"),
    [
        ("virtee-sev/report_milan.hex", "virtee-sev/vcek_milan.der", "bl=3 tee=0 snp=8 ucode=115"),
        (
            "go-sev-guest/attestation.bin",
            "go-sev-guest/vcek.testcer.der",
            "bl=2 tee=0 snp=5 ucode=68",
        ),
        ("trustee/test-report.bin", "trustee/test-vcek.der", "bl=3 tee=0 snp=8 ucode=115"),
        ("trustee/test-vlek-report.bin", "trustee/test-vlek.der", "bl=4 tee=0 snp=24 ucode=217"),
    ],
)
def test_genuine_sev_snp_reports_verify(report: str, certificate: str, tcb: str) -> None:
    verdict = snp(report, certificate)
    assert verdict.verified and verdict.status == "OK", verdict.reason
    assert verdict.tcb == tcb and len(verdict.measurement) == 96


def test_genuine_intel_quotes_verify_with_their_tcb_status() -> None:
    trust = tdx()
    assert trust.verified and trust.status == "UpToDate", trust.reason
    assert trust.measurement.startswith("91eb2b44d141d4ec")  # MRTD
    enclave = sgx()
    assert enclave.verified, enclave.reason
    assert enclave.status == "ConfigurationAndSWHardeningNeeded"
    assert enclave.advisories == ("INTEL-SA-00289", "INTEL-SA-00615")
    assert enclave.measurement.startswith("33d8736db756ed49")  # MRENCLAVE


def test_genuine_gpu_and_hygon_reports_verify() -> None:
    device = gpu()
    assert device.verified and device.chip.startswith("53c22ba15e5d"), device.reason
    csv = hygon()
    assert csv.verified and csv.chip == "NZA9T14052605", csv.reason
    assert csv.report_data.startswith(b"user data")


# --- refused, each with its reason ---------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "offset"),
    [("sev-snp", 0x95), ("tdx", 48 + 140), ("sgx", 48 + 70), ("nvidia", 300), ("csv", 150)],
)
def test_a_flipped_bit_in_the_report_is_refused(kind: str, offset: int) -> None:
    if kind == "sev-snp":
        report = flip(read(SNP / "trustee/test-report.bin"), offset)
        verdict = verify_evidence(
            kind, report, certs=[read(SNP / "trustee/test-vcek.der")], as_of=AMD_DAY
        )
    elif kind == "tdx":
        verdict = tdx(flip(read(TDX / "phala-dcap-qvl/tdx_quote"), offset))
    elif kind == "sgx":
        verdict = sgx(flip(read(SGX / "sgx_quote"), offset))
    elif kind == "nvidia":
        raw = bytes.fromhex(read(GPU / "nvtrust/hopperAttestationReport.txt").decode())
        verdict = gpu(evidence=flip(raw, offset))
    else:
        verdict = hygon(flip(read(CSV / "report.cert"), offset))
    assert not verdict.verified and verdict.status == "Refused"
    assert "bad signature" in verdict.reason or "not signed by its PEK" in verdict.reason


def test_a_report_checked_against_another_chips_vcek_is_refused() -> None:
    verdict = snp("trustee/test-report.bin", "virtee-sev/vcek_milan.der")
    assert not verdict.verified and "another chip's" in verdict.reason


def test_the_wrong_products_chain_is_refused() -> None:
    genoa_chain = snp(
        "virtee-sev/report_milan.hex",
        "virtee-sev/vcek_milan.der",
        "virtee-sev/genoa_ask.pem",
        "virtee-sev/genoa_ark.pem",
    )
    assert not genoa_chain.verified
    assert "the chain given is AMD Genoa's" in genoa_chain.reason
    assert "the report is from Milan" in genoa_chain.reason
    genoa_pinned = snp("virtee-sev/report_milan.hex", "virtee-sev/vcek_milan.der", product="genoa")
    assert "not signed by the AMD Genoa ASK" in genoa_pinned.reason
    own_chain = snp(
        "virtee-sev/report_milan.hex", "virtee-sev/vcek_milan.der", "virtee-sev/cert_chain_milan"
    )
    assert own_chain.verified  # control: Milan's own chain is accepted


def test_the_vlek_report_is_refused_after_its_certificate_expired() -> None:
    verdict = snp("trustee/test-vlek-report.bin", "trustee/test-vlek.der", as_of="2026-01-15")
    assert not verdict.verified and verdict.reason == "the AMD Milan VLEK expired on 2025-12-10"


@pytest.mark.parametrize("vcek", ["test-vcek-invalid-legacy.der", "test-vcek-invalid-new.der"])
def test_tampered_vceks_are_refused(vcek: str) -> None:
    verdict = snp("trustee/test-report.bin", f"trustee/{vcek}")
    assert not verdict.verified and "VCEK is not signed by the AMD Milan ASK" in verdict.reason


@pytest.mark.parametrize(
    ("chain", "reason"),
    [
        ("trustee/hopper_cert_chain_case2.txt", "only the root"),
        ("trustee/hopper_cert_chain_case3.txt", "is not signed by"),
        ("trustee/hopper_cert_chain_case4.txt", "bad signature"),
    ],
)
def test_nvidias_broken_chains_are_refused(chain: str, reason: str) -> None:
    verdict = gpu(chain)
    assert not verdict.verified and reason in verdict.reason


def test_the_2023_tdx_quote_matches_no_tcb_level() -> None:
    verdict = verify_evidence(
        "tdx",
        read(TDX / "go-tdx-guest/tdx_prod_quote_SPR_E4.dat"),
        collateral=go_tdx_collateral(),
        as_of=INTEL_2023,
    )
    assert not verdict.verified and "matches no level of the TCB info" in verdict.reason


def test_collateral_outside_its_window_is_refused() -> None:
    late = tdx(as_of="2025-08-01")
    assert not late.verified and "outside its window" in late.reason
    early = sgx(as_of="2025-06-01")
    assert not early.verified and "outside its window" in early.reason


def test_a_nonce_that_does_not_match_is_refused() -> None:
    report = read(SNP / "trustee/test-report.bin")
    bound = report[0x50:0x90]
    good = snp("trustee/test-report.bin", "trustee/test-vcek.der", report_data=bound)
    assert good.verified  # control: the report's own data passes
    bad = snp("trustee/test-report.bin", "trustee/test-vcek.der", report_data=b"\x01" * 32)
    assert not bad.verified and "does not match the nonce" in bad.reason
    assert hygon(report_data=b"user data").verified
    assert "does not match" in hygon(report_data=b"other data").reason


# --- the partition's policy ----------------------------------------------------------------


def test_a_wrong_measurement_for_the_partitions_policy_is_refused() -> None:
    measurement = snp("virtee-sev/report_milan.hex", "virtee-sev/vcek_milan.der").measurement
    allowed = AttestationPolicy(kinds=("sev-snp",), measurements=(measurement,))
    other = AttestationPolicy(kinds=("sev-snp",), measurements=("ab" * 48,))
    args = ("virtee-sev/report_milan.hex", "virtee-sev/vcek_milan.der")
    assert snp(*args, policy=allowed, partition="id_cards").verified
    refused = snp(*args, policy=other, partition="id_cards")
    assert not refused.verified and "is not one partition 'id_cards' allows" in refused.reason


def test_debug_a_low_tcb_and_an_unaccepted_status_are_refused_by_policy() -> None:
    debuggable = "go-sev-guest/attestation.bin", "go-sev-guest/vcek.testcer.der"
    measurement = snp(*debuggable).measurement
    policy = AttestationPolicy(kinds=("sev-snp",), measurements=(measurement,))
    assert "debuggable" in snp(*debuggable, policy=policy).reason
    allowed = policy.model_copy(update={"allow_debug": True})
    assert snp(*debuggable, policy=allowed).verified
    strict = allowed.model_copy(update={"min_tcb": {"snp": 8}})
    assert "TCB snp=5 is below" in snp(*debuggable, policy=strict).reason
    enclave = sgx()
    sgx_policy = AttestationPolicy(kinds=("sgx",), signers=(enclave.signer,))
    assert "ConfigurationAndSWHardeningNeeded is not one" in sgx(policy=sgx_policy).reason
    lenient = sgx_policy.model_copy(
        update={"tcb_statuses": ("UpToDate", "ConfigurationAndSWHardeningNeeded")}
    )
    assert sgx(policy=lenient).verified  # accepted by its MRSIGNER


# --- pinned roots, cache, CLI --------------------------------------------------------------


def test_the_pinned_roots_are_the_published_ones() -> None:
    roots = Path(__file__).resolve().parents[2] / "sandbox" / "attestation" / "roots"
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in roots.iterdir()}
    assert digests == {
        "README.md": digests["README.md"],
        "amd_genoa.pem": "7397ae50f4bac469",
        "amd_milan.pem": "cc871f0d22941763",
        "amd_turin.pem": "34251ef16c414387",
        "intel_sgx_root_ca.der": "44a0196b2b99f889",
        "nvidia_device_identity_ca.pem": "6e6e91e84068cb7d",
        "hygon_hrk.cert": "296efa97580464ac",
    }


def test_the_cache_keeps_the_chain_but_every_report_is_still_checked() -> None:
    cache = EndorsementCache()
    vcek = [read(SNP / "trustee/test-vcek.der")]
    report = read(SNP / "trustee/test-report.bin")
    assert verify_evidence("sev-snp", report, certs=vcek, as_of=AMD_DAY, cache=cache).verified
    assert verify_evidence("sev-snp", report, certs=vcek, as_of=AMD_DAY, cache=cache).verified
    tampered = verify_evidence(
        "sev-snp", flip(report, 0x95), certs=vcek, as_of=AMD_DAY, cache=cache
    )
    assert not tampered.verified
    assert (cache.hits, cache.misses) == (2, 1)


def test_a_cached_endorsement_never_outlives_the_evidence_it_endorsed() -> None:
    """The VLEK expired on 2025-12-10: endorsed at its last second, it is refused the next
    second, though the cache holds the chain (the cache is per second checked, not per day)."""
    cache = EndorsementCache()
    vlek = [read(SNP / "trustee/test-vlek.der")]
    report = read(SNP / "trustee/test-vlek-report.bin")
    certificate = x509.load_der_x509_certificate(vlek[0])
    last = certificate.not_valid_after_utc
    assert verify_evidence("sev-snp", report, certs=vlek, as_of=last, cache=cache).verified
    after = last + datetime.timedelta(seconds=1)
    refused = verify_evidence("sev-snp", report, certs=vlek, as_of=after, cache=cache)
    assert not refused.verified and "expired" in refused.reason


def test_a_tdx_measurement_is_the_firmware_and_what_it_booted() -> None:
    quote = read(TDX / "phala-dcap-qvl/tdx_quote")
    body = quote[48 : 48 + 584]  # a v4 quote's header, then its TD report body
    measurement = tdx().measurement
    assert measurement == (body[136:184] + body[328:520]).hex()  # MRTD, RTMR0-3
    policy = AttestationPolicy(kinds=("tdx",), measurements=(measurement,))
    assert tdx(policy=policy, partition="p").verified
    firmware_only = AttestationPolicy(kinds=("tdx",), measurements=(body[136:184].hex(),))
    assert not tdx(policy=firmware_only, partition="p").verified


def test_gpu_evidence_alone_cannot_release_a_key() -> None:
    with pytest.raises(ValueError, match="proves a GPU"):
        AttestationPolicy(kinds=("nvidia",), measurements=("ab" * 48,))
    assert AttestationPolicy(kinds=("nvidia", "sev-snp"), measurements=("ab" * 48,))


def test_unreadable_input_is_an_error_not_a_verdict() -> None:
    with pytest.raises(AttestationError, match="1184 bytes"):
        verify_evidence(
            "sev-snp", b"junk", certs=[read(SNP / "trustee/test-vcek.der")], as_of=AMD_DAY
        )
    with pytest.raises(AttestationError, match="collateral"):
        verify_evidence("tdx", read(TDX / "phala-dcap-qvl/tdx_quote"), as_of=INTEL_DAY)


def test_the_cli_prints_the_verdict_and_exits_0_1_or_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["attest", "verify", "--kind", "sev-snp", "--as-of", "2025-06-01"]
    report = str(SNP / "virtee-sev/report_milan.hex")
    vcek = str(SNP / "virtee-sev/vcek_milan.der")
    assert main([*base, "--evidence", report, "--certs", vcek]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert list(shown) == ["verified", "status", "measurement", "reason"]
    assert shown["verified"] is True and shown["reason"] == ""
    policy = tmp_path / "policy.yaml"
    gov = (Path(__file__).parents[2] / "policies" / "gov-onprem.yaml").read_text()
    policy.write_text(gov)
    with_policy = [*base, "--evidence", report, "--certs", vcek, "--policy", str(policy)]
    assert main([*with_policy, "--partition", "id_cards"]) == 2
    assert "no attestation policy" in capsys.readouterr().err
    measurement = shown["measurement"]
    attested = "    isolation: vm\n    attestation: {kinds: [sev-snp], measurements: [%s]}\n"
    policy.write_text(gov.replace("    isolation: vm\n", attested % measurement, 1))
    assert main([*with_policy, "--partition", "id_cards"]) == 0
    capsys.readouterr()
    policy.write_text(gov.replace("    isolation: vm\n", attested % ("cd" * 48), 1))
    assert main([*with_policy, "--partition", "id_cards"]) == 1
    assert "is not one partition 'id_cards' allows" in json.loads(capsys.readouterr().out)["reason"]
    wrong = str(SNP / "trustee/test-vcek.der")
    assert main([*base, "--evidence", report, "--certs", wrong, "--json"]) == 1
    refused = json.loads(capsys.readouterr().out)
    assert refused["verified"] is False and "another chip's" in refused["reason"]
    assert main([*base, "--evidence", str(tmp_path / "missing"), "--certs", vcek]) == 2
    with pytest.raises(SystemExit) as usage:
        main(["attest", "verify", "--kind", "sev-snp", "--evidence", report, "--as-of", "June"])
    assert usage.value.code == 2
