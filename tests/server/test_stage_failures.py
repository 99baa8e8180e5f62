"""A stage whose model cannot load: the server serves the others and says why, per stage.

Real models and real runtimes: the broken voice is a real ONNX Runtime / OpenVINO load of a
corrupt file, the missing program is a real ``PATH`` without ``espeak-ng``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hetero.framework.errors import MissingProgramError
from hetero.framework.policy import Policy, load_policy_text
from hetero.framework.server import Serving, create_app
from hetero.framework.server.serving import StagesFailedError
from hetero.models.embed import TextEmbedder
from hetero.models.tts import SpeechSynthesizer

TTS_AND_EMBED = """version: 1
stages:
  text_embed:
    modality: text
    model_version: all-minilm-l6-v2@1
    variants:
      full: {flops_per_item: 5.6 GFLOPS, bytes_per_item: 100 MB, max_batch: 32}
  tts:
    modality: text
    model_version: piper-joe-medium@1
    variants:
      full: {flops_per_item: 5 GFLOPS, bytes_per_item: 200 MB, batchable: false, max_batch: 1}
routes:
  /v1/embeddings: text_embed
  /v1/audio/speech: tts
qos:
  default_class: standard
  classes: {standard: {weight: 1, sla_tier: silver}}
sla_tiers: {silver: {deadline_ms: 5000}}
cache: {enabled: false}
"""
SPEECH = {"model": "piper-joe-medium", "input": "Hello there.", "response_format": "wav"}
EMBED = {"model": "all-minilm-l6-v2", "input": ["A man is eating food."]}


def policy() -> Policy:
    return load_policy_text(TTS_AND_EMBED, "tts-and-embed")


def broken_voice(folder: Path) -> type[SpeechSynthesizer]:
    """The real synthesizer over a voice file whose bytes are not an ONNX model."""
    real = SpeechSynthesizer().onnx_path
    corrupt = folder / real.name
    corrupt.write_bytes(b"this is not an onnx model" * 100)
    config = real.with_name(real.name + ".json")
    (folder / config.name).write_bytes(config.read_bytes())

    class BrokenVoice(SpeechSynthesizer):
        @property
        def onnx_path(self) -> Path:
            return corrupt

    return BrokenVoice


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Any, TestClient]]:
    tts = broken_voice(tmp_path) if request.param == "broken" else SpeechSynthesizer
    runtime = Serving(
        policy(), stage_models={"text_embed": TextEmbedder, "tts": tts}, probe_runtimes=False
    )
    runtime.start()
    with TestClient(create_app(runtime)) as client:
        yield runtime, client
    runtime.close()


@pytest.mark.parametrize("served", ["broken"], indirect=True)
def test_a_broken_voice_leaves_the_other_stages_serving(served: tuple[Any, TestClient]) -> None:
    runtime, client = served
    ready = client.get("/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["ready"] is True
    assert body["stages"]["text_embed"]["state"] == "ready"
    assert body["stages"]["tts"]["state"] == "failed"
    reason = body["stages"]["tts"]["reason"]
    assert reason == runtime.failed["tts"].reason
    assert reason and "espeak" not in reason  # the voice file failed, not the phonemizer
    speech = client.post("/v1/audio/speech", json=SPEECH)
    assert speech.status_code == 503
    error = speech.json()["error"]
    assert error["code"] == "stage_unavailable" and reason in error["message"]
    assert client.post("/v1/embeddings", json=EMBED).status_code == 200
    listed = [model["id"] for model in client.get("/v1/models").json()["data"]]
    assert listed == ["all-minilm-l6-v2"]


@pytest.mark.parametrize("served", ["real"], indirect=True)
def test_control_the_real_voice_loads_and_speaks(served: tuple[Any, TestClient]) -> None:
    runtime, client = served
    assert not runtime.failed
    assert client.get("/ready").json()["stages"]["tts"]["state"] == "ready"
    speech = client.post("/v1/audio/speech", json=SPEECH)
    assert speech.status_code == 200 and speech.content[:4] == b"RIFF"


def test_missing_espeak_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a real PATH with no espeak-ng on it
    with pytest.raises(MissingProgramError, match="apt-get install espeak-ng"):
        SpeechSynthesizer().load()
    runtime = Serving(
        policy(),
        stage_models={"text_embed": TextEmbedder, "tts": SpeechSynthesizer},
        probe_runtimes=False,
    )
    runtime.start()
    try:
        with TestClient(create_app(runtime)) as client:
            states = client.get("/ready").json()["stages"]
            assert states["tts"]["state"] == "failed"
            assert "apt-get install espeak-ng" in states["tts"]["reason"]
            answer = client.post("/v1/audio/speech", json=SPEECH)
            assert answer.status_code == 503
            assert "apt-get install espeak-ng" in answer.json()["error"]["message"]
    finally:
        runtime.close()


def test_require_all_stages_fails_start_up(tmp_path: Path) -> None:
    runtime = Serving(
        policy(),
        stage_models={"text_embed": TextEmbedder, "tts": broken_voice(tmp_path)},
        probe_runtimes=False,
        require_all_stages=True,
    )
    with pytest.raises(StagesFailedError, match="tts"):
        runtime.start()
    assert not runtime.stages  # what loaded before the failure was released
    runtime.close()


def test_serve_require_all_stages_exits_1_with_the_reason(tmp_path: Path) -> None:
    policy_file = tmp_path / "tts.yaml"
    policy_file.write_text(TTS_AND_EMBED)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # no espeak-ng on it
    serve = ["serve", "--policy", str(policy_file), "--port", "0", "--no-probe"]
    result = subprocess.run(
        [sys.executable, "-m", "hetero.framework.cli", *serve, "--require-all-stages"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert "tts" in result.stderr and "apt-get install espeak-ng" in result.stderr
    assert "Traceback" not in result.stderr
