"""The stage contract without running models: registration, cheap import, cache writes."""

from __future__ import annotations

import subprocess
import sys
import threading
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from hetero.models.assets import build_once, model_cache_dir
from hetero.models.llm import TextGenerator
from hetero.models.vision import VisionEncoder

STAGES = {"vision_encode", "ocr", "asr", "tts", "text_embed", "llm_generate"}


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def register(self, kind: str, name: str, obj: Any) -> None:
        self.calls.append((kind, name, obj))


def test_entry_point_registers_every_stage() -> None:
    (entry,) = [e for e in entry_points(group="hetero.plugins") if e.name == "models"]
    recorder = _Recorder()
    entry.load()(recorder)
    assert {kind for kind, _, _ in recorder.calls} == {"stage_model"}
    assert {name for _, name, _ in recorder.calls} == STAGES
    for _, name, cls in recorder.calls:
        assert cls.name == name
        assert set(cls.runtimes) <= {"onnxruntime", "openvino", "torch"}


def test_importing_models_and_plugin_stays_cheap() -> None:
    code = (
        "import sys, hetero.models, hetero.models.plugin as p\n"
        "class R:\n def register(self, *a): pass\n"
        "p.register(R())\n"
        "heavy = {'torch', 'transformers', 'onnxruntime', 'openvino', 'PIL', 'cv2'}\n"
        "heavy &= set(sys.modules)\n"
        "assert not heavy, heavy\n"
        "assert hetero.models.VisionEncoder.name == 'vision_encode'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr  # the child asserts no heavy module loaded


def test_a_runtime_the_stage_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="llm_generate"):
        TextGenerator(runtime="openvino")
    with pytest.raises(ValueError, match="threads"):
        VisionEncoder(threads=0)


def test_unknown_variant_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="variant"):
        VisionEncoder(cache_dir=tmp_path).encode([b"x"], variant="tiny")


def test_cache_dir_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HETERO_MODEL_CACHE", str(tmp_path))
    assert model_cache_dir() == tmp_path
    assert VisionEncoder().cache_dir == tmp_path
    assert model_cache_dir(tmp_path / "x") == tmp_path / "x"


def test_build_once_builds_once_under_concurrency(tmp_path: Path) -> None:
    calls = []
    barrier = threading.Barrier(4)

    def build(path: Path) -> None:
        calls.append(path)
        path.write_text("done")

    def worker() -> None:
        barrier.wait()
        build_once(tmp_path / "artefact.txt", build)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert (tmp_path / "artefact.txt").read_text() == "done"
    assert calls[0] != tmp_path / "artefact.txt"  # written aside, then renamed


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    def build(path: Path) -> None:
        path.write_text("half")
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError, match="export failed"):
        build_once(tmp_path / "artefact.onnx", build)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_plugins_measure_a_request_cheaply_for_admission() -> None:
    from hetero.framework.samples import photo_png, speech_like_wav
    from hetero.models.asr import SpeechRecognizer
    from hetero.models.embed import TextEmbedder

    assert VisionEncoder().profile(photo_png(size=(320, 240))).image_pixels == 320 * 240
    seconds = SpeechRecognizer().profile(speech_like_wav(2.5)).audio_seconds
    assert abs(seconds - 2.5) < 1e-6
    # 4 characters a token plus [CLS] and [SEP]; a text counts at most its first 256 tokens
    assert TextEmbedder().profile(["a" * 40, "b" * 40]).text_tokens == 2 * (10 + 2)
    assert TextEmbedder().profile(["c" * 50_000]).text_tokens == 256 + 2
