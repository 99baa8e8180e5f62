"""Voice activity detection with Silero VAD (``silero-vad`` package): a helper ONNX graph of the
speech stage, run frame by frame (512 samples at 16 kHz plus 64 samples of context) with a
recurrent state on the host CPU beside the stage's main graphs, wherever those are placed
(OpenVINO cannot read it, and a frame takes well under a millisecond on ONNX Runtime)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.stage_plugin import GraphRunner
from hetero.models.assets import package_file

__all__ = ["SAMPLE_RATE", "speech_probabilities", "speech_segments", "vad_graph"]

SAMPLE_RATE = 16000
FRAME = 512
CONTEXT = 64


def vad_graph() -> ComputeGraph:
    """The Silero VAD as an ONNX graph (2 MB; a frame costs ~0.3 MFLOPs)."""
    hint = BandwidthHint(
        flops_per_item=0.3e6 * 30 * 1000 / 32,  # a 30 s window, frame by frame
        bytes_per_item=2.3e6,
        resident_bytes=int(2.3e6),
        batchable=False,
    )
    return ComputeGraph(
        "asr/vad",
        GraphFormat.ONNX,
        package_file("silero_vad", "data", "silero_vad.onnx"),
        hint,
        input_names=("input", "state", "sr"),
        metadata=(("model", "silero-vad"),),
        helper=True,  # OpenVINO cannot read it, and per-frame calls suit the host CPU
    )


def speech_probabilities(runner: GraphRunner, graph: str, samples: np.ndarray) -> list[float]:
    """Speech probability of each 32 ms frame of 16 kHz mono ``samples``."""
    padded = np.pad(samples.astype(np.float32), (0, (-samples.shape[0]) % FRAME))
    state = np.zeros((2, 1, 128), dtype=np.float32)
    context = np.zeros(CONTEXT, dtype=np.float32)
    rate = np.array(SAMPLE_RATE, dtype=np.int64)
    probs = []
    for start in range(0, padded.shape[0], FRAME):
        frame = padded[start : start + FRAME]
        chunk = np.concatenate([context, frame])[None, :]
        out = runner.run(graph, {"input": chunk, "state": state, "sr": rate})
        state = out["stateN"]
        probs.append(float(out["output"].reshape(-1)[0]))
        context = frame[-CONTEXT:]
    return probs


def speech_segments(
    runner: GraphRunner, graph: str, samples: np.ndarray, threshold: float = 0.5
) -> list[tuple[int, int]]:
    """``(start, end)`` sample offsets of speech, padded by 100 ms either side."""
    from silero_vad.utils_vad import get_speech_timestamps_from_probs

    if samples.shape[0] < FRAME:
        return []
    stamps: list[dict[str, Any]] = get_speech_timestamps_from_probs(
        speech_probabilities(runner, graph, samples),
        sampling_rate=SAMPLE_RATE,
        threshold=threshold,
        speech_pad_ms=100,
        audio_length_samples=int(samples.shape[0]),
    )
    return [(int(s["start"]), int(s["end"])) for s in stamps]
