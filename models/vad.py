"""Voice activity detection with Silero VAD (``silero-vad`` package), ONNX on ONNX Runtime.

The model runs frame by frame (512 samples at 16 kHz plus 64 samples of context) with a
recurrent state; ONNX Runtime does a frame in well under a millisecond while OpenVINO's
per-call overhead is several times that, so the VAD always runs on ONNX Runtime whatever
runtime the speech recogniser uses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetero.models.assets import package_file

__all__ = ["SAMPLE_RATE", "SileroVad"]

SAMPLE_RATE = 16000
FRAME = 512
CONTEXT = 64


class SileroVad:
    """Speech segments of 16 kHz mono audio."""

    def __init__(self, threads: int = 1) -> None:
        from hetero.models.sessions import open_onnx

        self._session = open_onnx(
            package_file("silero_vad", "data", "silero_vad.onnx"), "onnxruntime", threads
        )

    def probabilities(self, samples: np.ndarray) -> list[float]:
        """Speech probability of each 32 ms frame."""
        padded = np.pad(samples.astype(np.float32), (0, (-samples.shape[0]) % FRAME))
        state = np.zeros((2, 1, 128), dtype=np.float32)
        context = np.zeros(CONTEXT, dtype=np.float32)
        rate = np.array(SAMPLE_RATE, dtype=np.int64)
        probs = []
        for start in range(0, padded.shape[0], FRAME):
            frame = padded[start : start + FRAME]
            chunk = np.concatenate([context, frame])[None, :]
            out, state = self._session.run({"input": chunk, "state": state, "sr": rate})
            probs.append(float(out.reshape(-1)[0]))
            context = frame[-CONTEXT:]
        return probs

    def segments(self, samples: np.ndarray, threshold: float = 0.5) -> list[tuple[int, int]]:
        """``(start, end)`` sample offsets of speech, padded by 100 ms either side."""
        from silero_vad.utils_vad import get_speech_timestamps_from_probs

        if samples.shape[0] < FRAME:
            return []
        stamps: list[dict[str, Any]] = get_speech_timestamps_from_probs(
            self.probabilities(samples),
            sampling_rate=SAMPLE_RATE,
            threshold=threshold,
            speech_pad_ms=100,
            audio_length_samples=int(samples.shape[0]),
        )
        return [(int(s["start"]), int(s["end"])) for s in stamps]
