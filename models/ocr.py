"""OCR: PP-OCRv4 detection, direction classification and recognition (Chinese + English).

The ONNX files and the pre/post-processing come from ``rapidocr-onnxruntime==1.4.4`` (pinned:
rapidocr 3.x downloads its models at run time). On ``onnxruntime`` its own sessions run; on
``openvino`` the three sessions are swapped for OpenVINO (f32) ones after construction, with
rapidocr's pre/post-processing unchanged. The ``light`` variant downscales the page so its long
side is at most 960 px before detection. The recogniser tends to drop spaces between English
words; compare text with whitespace removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetero.framework.errors import InvalidInputError
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.models.assets import package_file
from hetero.models.base import ModelStage
from hetero.models.media import decode_image

__all__ = ["OcrLine", "OcrResult", "TextReader"]

LIGHT_LONG_SIDE = 960
MAX_ASPECT = 50  # wider or taller than this is not a page or a text line (rapidocr fails on it)
_PACKAGE = "rapidocr_onnxruntime"
_DET = "ch_PP-OCRv4_det_infer.onnx"
_CLS = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
_REC = "ch_PP-OCRv4_rec_infer.onnx"


@dataclass(frozen=True, slots=True)
class OcrLine:
    """One detected line of text.

    Attributes:
        text: The recognised text.
        confidence: Mean character confidence, 0 to 1.
        box: Four ``(x, y)`` corners in pixels of the input image, clockwise from top left.
    """

    text: str
    confidence: float
    box: tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class OcrResult:
    """The text of an image.

    Attributes:
        text: Lines in reading order (top to bottom, left to right), joined by newlines.
        lines: Each line with its confidence and box.
    """

    text: str
    lines: tuple[OcrLine, ...]


class _OpenVinoInfer:
    """Stands in for rapidocr's ``OrtInferSession`` (called with one input, returns outputs)."""

    def __init__(self, path: Path, threads: int) -> None:
        from hetero.models.sessions import open_onnx

        self._session = open_onnx(path, "openvino", threads)

    def __call__(self, input_content: np.ndarray) -> list[np.ndarray]:
        return self._session(input_content)


class TextReader(ModelStage):
    """PP-OCRv4 through rapidocr on ONNX Runtime, or the same graphs on OpenVINO."""

    name = "ocr"
    runtimes = ("onnxruntime", "openvino")

    def __init__(
        self, *, runtime: str = "onnxruntime", cache_dir: Path | None = None, threads: int = 1
    ) -> None:
        super().__init__(runtime=runtime, cache_dir=cache_dir, threads=threads)
        self._engine: Any = None

    def _load(self) -> None:
        from rapidocr_onnxruntime import RapidOCR

        engine = RapidOCR(intra_op_num_threads=self.threads, inter_op_num_threads=1)
        if self.runtime == "openvino":
            models = package_file(_PACKAGE, "models")
            engine.text_det.infer = _OpenVinoInfer(models / _DET, self.threads)
            engine.text_cls.infer = _OpenVinoInfer(models / _CLS, self.threads)
            engine.text_rec.session = _OpenVinoInfer(models / _REC, self.threads)
        self._engine = engine

    def _close(self) -> None:
        self._engine = None

    def read(self, image: bytes, variant: str = "full") -> OcrResult:
        """Read the text in an image (PNG, JPEG, ... bytes).

        Raises:
            InvalidInputError: The image cannot be decoded.
        """
        self._check_variant(variant)
        picture = decode_image(image)
        scale = 1.0
        if variant == "light" and max(picture.size) > LIGHT_LONG_SIDE:
            from PIL import Image

            scale = LIGHT_LONG_SIDE / max(picture.size)
            size = (max(1, round(picture.width * scale)), max(1, round(picture.height * scale)))
            picture = picture.resize(size, Image.Resampling.BILINEAR)
        width, height = picture.size
        if max(width, height) > MAX_ASPECT * min(width, height):
            raise InvalidInputError(
                f"image is {width}x{height}: OCR needs a page or a line of text "
                f"(aspect ratio at most {MAX_ASPECT}:1)"
            )
        bgr = np.ascontiguousarray(np.asarray(picture)[:, :, ::-1])
        self.load()
        try:
            found, _ = self._engine(bgr)
        except Exception as err:  # rapidocr raises bare Exceptions (ResizeImgError, ...)
            raise InvalidInputError(f"OCR could not process this image: {err}") from err
        lines = []
        for box, text, score in found or ():
            corners = tuple((float(x) / scale, float(y) / scale) for x, y in box)
            lines.append(OcrLine(str(text), float(score), corners))
        return OcrResult("\n".join(line.text for line in lines), tuple(lines))

    def graph(self, variant: str = "full") -> ComputeGraph:
        """The detection network (it dominates the cost); hint for a 960x736 page."""
        self._check_variant(variant)
        pixels = 960 * 736 if variant == "full" else 640 * 480
        hint = BandwidthHint(
            flops_per_item=4.0e3 * pixels,
            bytes_per_item=4.7e6 + 4.0 * 3 * pixels * 12,
            input_bytes=4 * 3 * pixels,
            output_bytes=4 * pixels,
            resident_bytes=int(16e6 * 2),
            batchable=False,
            max_batch=1,
        )
        return ComputeGraph(
            f"{self.name}/{variant}",
            GraphFormat.ONNX,
            package_file(_PACKAGE, "models", _DET),
            hint,
            input_names=("x",),
            metadata=(("model", "PP-OCRv4 det+cls+rec"), ("recogniser", _REC)),
        )
