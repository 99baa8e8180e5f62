"""Piper TTS and Whisper ASR: round trip, silence, long audio, runtimes, bad input."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import soundfile

from hetero.framework.errors import InvalidInputError
from hetero.models.asr import SpeechRecognizer
from hetero.models.media import resample
from hetero.models.tts import SpeechSynthesizer

SENTENCE = "The quick brown fox jumps over the lazy dog."


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def _flac(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="FLAC")
    return buffer.getvalue()


def test_wav_bytes_decode_back(synthesizer: SpeechSynthesizer, sentence_wav: bytes) -> None:
    samples, rate = soundfile.read(io.BytesIO(sentence_wav), dtype="float32")
    assert rate == 22050
    assert 1.5 < samples.shape[0] / rate < 5.0
    assert float(np.abs(samples).max()) > 0.1


def test_deterministic_synthesis_repeats_and_speed_shortens(
    synthesizer: SpeechSynthesizer,
) -> None:
    a = synthesizer.synthesize("Good morning.", deterministic=True)
    b = synthesizer.synthesize("Good morning.", deterministic=True)
    np.testing.assert_array_equal(a.samples, b.samples)
    fast = synthesizer.synthesize("Good morning.", speed=2.0, deterministic=True)
    assert fast.duration_s < 0.7 * a.duration_s


def test_openvino_voice_matches_onnxruntime(synthesizer: SpeechSynthesizer) -> None:
    stage = SpeechSynthesizer(runtime="openvino", cache_dir=synthesizer.cache_dir)
    ov = stage.synthesize("Good morning.", deterministic=True)
    ort = synthesizer.synthesize("Good morning.", deterministic=True)
    assert ov.samples.shape == ort.samples.shape
    np.testing.assert_allclose(ov.samples, ort.samples, atol=1e-3)
    stage.close()


def test_tts_then_asr_recovers_the_sentence(
    recognizer: SpeechRecognizer, sentence_wav: bytes
) -> None:
    transcript = recognizer.transcribe(sentence_wav)
    heard, said = set(_words(transcript.text)), _words(SENTENCE)
    assert sum(word in heard for word in said) >= 0.8 * len(said)
    assert transcript.duration_s == pytest.approx(
        len(soundfile.read(io.BytesIO(sentence_wav))[0]) / 22050
    )
    assert 0.5 * transcript.duration_s < transcript.speech_s <= transcript.duration_s + 0.01


def test_openvino_and_torch_encoders_agree(
    recognizer: SpeechRecognizer, sentence_wav: bytes
) -> None:
    want = recognizer.transcribe(sentence_wav).text
    for runtime in ("openvino", "torch"):
        stage = SpeechRecognizer(runtime=runtime, cache_dir=recognizer.cache_dir)
        assert stage.transcribe(sentence_wav).text == want
        stage.close()


def test_silence_has_no_speech(recognizer: SpeechRecognizer) -> None:
    rng = np.random.default_rng(0)
    hiss = (rng.standard_normal(16000 * 3) * 1e-4).astype(np.float32)
    transcript = recognizer.transcribe(_flac(hiss, 16000))
    assert transcript.text == ""
    assert transcript.speech_s == 0.0
    assert transcript.duration_s == pytest.approx(3.0)


def test_audio_over_30_s_is_windowed(recognizer: SpeechRecognizer, sentence_wav: bytes) -> None:
    speech, rate = soundfile.read(io.BytesIO(sentence_wav), dtype="float32")
    gap = np.zeros(rate // 2, dtype=np.float32)
    long = np.concatenate([np.concatenate([speech, gap])] * 12)  # about 39 s
    stereo = np.stack([long, long], axis=1)
    audio = _flac(resample(stereo[:, 0], rate, 44100), 44100)
    transcript = recognizer.transcribe(audio)
    assert transcript.duration_s > 30
    assert _words(transcript.text).count("fox") >= 9
    light = recognizer.transcribe(audio, variant="light")
    assert _words(light.text).count("fox") < _words(transcript.text).count("fox")


@pytest.mark.parametrize("data", [b"", b"RIFF\x00\x00\x00\x00WAVEfmt garbage", b"\xff" * 100])
def test_undecodable_audio_is_invalid_input(recognizer: SpeechRecognizer, data: bytes) -> None:
    with pytest.raises(InvalidInputError, match="audio"):
        recognizer.transcribe(data)


@pytest.mark.parametrize("text", ["", "   ", "..."])
def test_unspeakable_text_is_invalid_input(synthesizer: SpeechSynthesizer, text: str) -> None:
    with pytest.raises(InvalidInputError):
        synthesizer.synthesize(text)


def test_resample_keeps_a_tone() -> None:
    rate = 44100
    t = np.arange(rate) / rate
    tone = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    out = resample(tone, rate, 16000)
    assert out.shape == (16000,)
    spectrum = np.abs(np.fft.rfft(out))
    assert int(np.argmax(spectrum)) == 440
