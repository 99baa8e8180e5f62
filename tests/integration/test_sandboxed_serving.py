"""A sensitive stage served for real: the HTTP request is checked and audited, the image is
sealed into its partition, the real OCR model runs inside a runc sandbox that decrypts it there,
and the answer is masked for the caller's role."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from fastapi.testclient import TestClient

from hetero.framework.policy import Policy, load_policy_text
from hetero.framework.samples import text_page_png
from hetero.framework.server import Serving, create_app
from hetero.sandbox.audit import verify
from hetero.sandbox.keyring import FileKeyring
from hetero.sandbox.serving import SandboxedStages, build_gate

OFFICER_KEY, ANALYST_KEY = "officer-key-123", "analyst-key-456"
MOBILE = "13812345678"


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def site_policy(site: Path) -> Policy:
    return load_policy_text(site_policy_text(site), "sandboxed-serving-test")


def site_policy_text(site: Path) -> str:
    """A site with two sensitive partitions, each served in its own runc sandbox."""
    return f"""version: 1
partitions:
  id_cards:
    modality: image
    classification: secret
    cipher: SM4-GCM
    key: file:id-cards
    isolation: container
    roles: [case_officer]
    attribute_rules:
      - {{attribute: department, one_of: [public-security]}}
  petitions:
    modality: audio
    classification: confidential
    cipher: AES-256-GCM
    key: file:petitions
    isolation: container
    retention_days: 180
    roles: [case_officer]
stages:
  id_card_ocr:
    modality: image
    partition: id_cards
    model_version: pp-ocrv4@1
    variants:
      full: {{flops_per_item: 8 GFLOPS, bytes_per_item: 120 MB}}
  petition_asr:
    modality: audio
    partition: petitions
    model_version: whisper-tiny.en@1
    variants:
      full: {{flops_per_item: 30 GFLOPS, bytes_per_item: 400 MB}}
routes:
  /v1/id-cards/read: id_card_ocr
  /v1/petitions/transcribe: petition_asr
qos:
  default_class: routine
  classes:
    routine: {{weight: 1, sla_tier: hour}}
sla_tiers:
  hour: {{deadline_ms: 3600000}}
cache: {{enabled: false}}
masking:
  clear_for: {{mobile: [auditor]}}
audit:
  path: {site / "audit.log"}
  signing_key: {site / "audit.pem"}
sandbox:
  runtimes: [runc]
  keyring: {site / "keyring.json"}
  state_dir: {site / "state"}
  partitions_dir: {site / "partitions"}
server:
  api_keys:
    - {{name: li.wei, sha256: {_sha(OFFICER_KEY)}, roles: [case_officer],
       attributes: {{department: public-security}}}}
    - {{name: zhao, sha256: {_sha(ANALYST_KEY)}, roles: [analyst]}}
"""


@pytest.fixture(scope="module")
def site() -> Iterator[Path]:
    if shutil.which("runc") is None:
        pytest.fail("runc is not installed: `make test` installs it (tools/sysdeps.sh)")
    directory = Path(tempfile.mkdtemp(prefix="hetero-serving-sandbox-"))
    directory.chmod(0o711)
    FileKeyring.create(directory / "keyring.json", {"id-cards": 16, "petitions": 32})
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def client(site: Path) -> Iterator[TestClient]:
    policy = site_policy(site)
    gate = build_gate(policy)
    runtime = Serving(
        policy, gate=gate, sandboxes=SandboxedStages(policy, gate), probe_runtimes=False
    )
    runtime.start()
    assert runtime.unserved == {}, runtime.unserved
    try:
        with TestClient(create_app(runtime)) as test_client:
            yield test_client
    finally:
        runtime.close()


PAGE = text_page_png(["HETERO 2026", f"TEL {MOBILE}"])


def read(client: TestClient, key: str | None, image: bytes = PAGE) -> object:
    import base64

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"inputs": {"image": base64.b64encode(image).decode()}}
    return client.post("/v1/id-cards/read", json=body, headers=headers)


def test_ocr_runs_in_the_sandbox_and_the_answer_is_masked(client: TestClient, site: Path) -> None:
    response = read(client, OFFICER_KEY)
    assert response.status_code == 200, response.text  # type: ignore[attr-defined]
    (output,) = response.json()["outputs"].values()  # type: ignore[attr-defined]
    text = output["text"].replace(" ", "")
    assert "HETERO2026" in text.upper()
    assert "138****5678" in text and MOBILE not in text  # officers are not cleared for mobiles
    (stage,) = response.json()["hetero"]["stages"]  # type: ignore[attr-defined]
    assert stage["device"] == "sandbox:id_cards"  # placed on its partition's sandbox
    # the image went into the partition sealed, and was deleted after use (no retention)
    files = [p for p in site.rglob("*") if p.is_file()]
    assert not [p for p in files if PAGE in p.read_bytes()]
    assert not [p for p in files if MOBILE.encode() in p.read_bytes()]


def test_callers_without_a_key_or_the_role_are_refused_and_audited(
    client: TestClient, site: Path
) -> None:
    anonymous = read(client, None)
    analyst = read(client, ANALYST_KEY)
    assert anonymous.status_code == 401  # type: ignore[attr-defined]
    assert analyst.status_code == 403  # type: ignore[attr-defined]
    assert "partitions.id_cards.roles" in analyst.json()["error"]["message"]  # type: ignore[attr-defined]
    records = [json.loads(line) for line in (site / "audit.log").read_text().splitlines()]
    kinds = [(r["kind"], r["decision"], r["principal"]) for r in records]
    assert ("sandbox_start", "", "") in kinds
    assert ("access", "deny", "zhao") in kinds and ("access", "allow", "li.wei") in kinds
    assert any(r["kind"] == "key_use" for r in records)


def test_a_corrupt_image_is_a_400_from_inside_the_sandbox(client: TestClient) -> None:
    response = read(client, OFFICER_KEY, image=b"\x89PNG\r\n\x1a\n not really a png")
    assert response.status_code == 400, response.text  # type: ignore[attr-defined]
    assert read(client, OFFICER_KEY).status_code == 200  # type: ignore[attr-defined]


def test_the_audit_log_verifies(client: TestClient, site: Path) -> None:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key((site / "audit.pem").read_bytes(), password=None)
    assert verify(site / "audit.log", key.public_key()).ok  # type: ignore[arg-type]


def test_speech_is_transcribed_inside_its_own_partitions_sandbox(
    client: TestClient, site: Path
) -> None:
    import base64

    from hetero.models.tts import SpeechSynthesizer

    voice = SpeechSynthesizer()
    voice.load()
    wav = voice.synthesize("Please fix the street light.", deterministic=True).wav_bytes()
    response = client.post(
        "/v1/petitions/transcribe",
        json={"inputs": {"audio": base64.b64encode(wav).decode()}},
        headers={"Authorization": f"Bearer {OFFICER_KEY}"},
    )
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"].values()
    assert "street light" in output["text"].lower()
    # retained (180 days) in its own partition, sealed; the id-card partition got nothing
    (kept,) = [p for p in (site / "partitions" / "petitions").iterdir()]
    assert wav not in kept.read_bytes() and kept.stat().st_uid == 165_536
    assert list((site / "partitions" / "id_cards").iterdir()) == []


def test_a_request_names_its_data_subject_and_erasure_reaches_what_was_kept(
    client: TestClient, site: Path
) -> None:
    """Issue 37 F1: the subject header (or the body's ``user``) goes with the recording into
    the partition, so erasure by subject finds it; an unnamed subject finds nothing."""
    from hetero.models.tts import SpeechSynthesizer
    from hetero.sandbox.keys import open_key
    from hetero.sandbox.partition_store import PartitionStore

    voice = SpeechSynthesizer()
    voice.load()
    wav = voice.synthesize("The bus stop sign is broken.", deterministic=True).wav_bytes()
    body = {"inputs": {"audio": base64.b64encode(wav).decode()}}
    officer = {"Authorization": f"Bearer {OFFICER_KEY}"}
    by_header = client.post(
        "/v1/petitions/transcribe", json=body, headers={**officer, "X-Data-Subject": "citizen-7"}
    )
    assert by_header.status_code == 200, by_header.text
    by_user = client.post(
        "/v1/petitions/transcribe", json={**body, "user": "citizen-8"}, headers=officer
    )
    assert by_user.status_code == 200, by_user.text
    blank = client.post(
        "/v1/petitions/transcribe", json=body, headers={**officer, "X-Data-Subject": " "}
    )
    assert blank.status_code == 400 and blank.json()["error"]["param"] == "X-Data-Subject"
    policy = site_policy(site)
    config = policy.spec.partitions["petitions"]
    keyring, name = open_key(config.key, policy.spec.sandbox)
    store = PartitionStore(site / "partitions", "petitions", keyring, name, config.cipher)
    kept = len(store.object_ids())
    assert store.erase_subject("citizen-nobody") == {}  # the control: nothing is theirs
    assert len(store.erase_subject("citizen-7")) == 1
    assert len(store.erase_subject("citizen-8")) == 1
    assert len(store.object_ids()) == kept - 2


@pytest.fixture
def fresh_site() -> Iterator[Path]:
    if shutil.which("runc") is None:
        pytest.fail("runc is not installed: `make test` installs it (tools/sysdeps.sh)")
    directory = Path(tempfile.mkdtemp(prefix="hetero-signals-"))
    directory.chmod(0o711)
    FileKeyring.create(directory / "keyring.json", {"id-cards": 16, "petitions": 32})
    (directory / "policy.yaml").write_text(site_policy_text(directory))
    yield directory
    for leftover in running_sandboxes(directory):  # only when the test failed: no orphans
        command = ["runc", "--root", str(runc_root(directory)), "delete", "--force", leftover]
        subprocess.run(command, check=False)
    shutil.rmtree(directory, ignore_errors=True)


def runc_root(site: Path) -> Path:
    return site / "state" / "runc" / "state"


def running_sandboxes(site: Path) -> list[str]:
    listed = subprocess.run(
        ["runc", "--root", str(runc_root(site)), "list", "-q"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_every_sandbox_and_is_audited(
    fresh_site: Path, stop: signal.Signals
) -> None:
    """``hetero serve`` stopped by SIGTERM (systemd, Kubernetes, ``docker stop``) or SIGINT
    drains, stops every partition's runc sandbox, writes the audit records and exits 0 (SIGTERM
    used to kill it with both sandboxes running)."""
    site = fresh_site
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hetero.framework.cli",
            "serve",
            "--no-probe",
            "--port",
            "0",
            "--policy",
            str(site / "policy.yaml"),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert serve.stderr is not None
        url = ""
        said: list[str] = []  # what it said, for the failure's message
        for line in serve.stderr:  # until the models (and so both sandboxes) are up
            said.append(line)
            found = re.search(r"listening on (http://\S+)", line)
            url = found.group(1) if found else url
            if line.startswith("ready"):
                break
        assert url, "hetero serve did not say where it listens:\n" + "".join(said)[-3000:]
        assert len(running_sandboxes(site)) == 2  # the control: both partitions' sandboxes run
        response = httpx.post(
            f"{url}/v1/id-cards/read",
            json={"inputs": {"image": base64.b64encode(PAGE).decode()}},
            headers={"Authorization": f"Bearer {OFFICER_KEY}"},
            timeout=120,
        )
        assert response.status_code == 200, response.text
        serve.send_signal(stop)
        rest = serve.stderr.read()
        assert serve.wait(timeout=120) == 0, rest
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    assert "Traceback" not in rest
    assert running_sandboxes(site) == []
    records = [json.loads(line) for line in (site / "audit.log").read_text().splitlines()]
    stopped = {r["partition"] for r in records if r["kind"] == "sandbox_stop"}
    assert stopped == {"id_cards", "petitions"}
    key = load_pem_private_key((site / "audit.pem").read_bytes(), password=None)
    assert verify(site / "audit.log", key.public_key()).ok  # type: ignore[arg-type]


def test_stages_whose_sandbox_runc_could_not_mount_are_unserved_with_the_fix(site: Path) -> None:
    private = site.resolve() / "private-home"  # the check names resolved paths
    private.mkdir(mode=0o700)  # a state directory under it: runc cannot mount the root there
    text = (
        site_policy_text(site)
        .replace(f"state_dir: {site / 'state'}", f"state_dir: {private / 'state'}")
        .replace(str(site / "audit."), str(site / "unserved-audit."))
    )
    policy = load_policy_text(text, "private-state")
    gate = build_gate(policy)
    runtime = Serving(
        policy, gate=gate, sandboxes=SandboxedStages(policy, gate), probe_runtimes=False
    )
    runtime.start()
    try:
        assert set(runtime.unserved) == {"id_card_ocr", "petition_asr"}, runtime.unserved
        for reason in runtime.unserved.values():
            assert f"cannot pass {private} (mode 0700)" in reason, reason
            assert "set sandbox.state_dir" in reason
    finally:
        runtime.close()
    assert not (private / "state" / "workers").exists()  # nothing was started or built
