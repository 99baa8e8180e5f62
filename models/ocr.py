"""OCR: PP-OCRv4 detection, direction classification and recognition (Chinese + English).

The ONNX files and the pre/post-processing come from ``rapidocr-onnxruntime==1.4.4`` (pinned:
rapidocr 3.x downloads its models at run time). rapidocr is built with stand-ins for its ONNX
Runtime sessions, so its three networks run as graphs on whatever device the stage is placed on,
with rapidocr's pre/post-processing unchanged. The ``light`` variant downscales the page so its long
side is at most 960 px before detection. The recogniser tends to drop spaces between English
words; compare text with whitespace removed.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetero.framework.errors import ExecutionError, InvalidInputError
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.request_profile import RequestProfile
from hetero.framework.samples import text_page_png
from hetero.framework.stage_plugin import GraphRunner, each
from hetero.models.assets import package_file
from hetero.models.base import ModelStage, image_profile
from hetero.models.media import decode_image

__all__ = ["OcrLine", "OcrResult", "TextReader"]

LIGHT_LONG_SIDE = 960
MAX_ASPECT = 50  # wider or taller than this is not a page or a text line (rapidocr fails on it)
_PACKAGE = "rapidocr_onnxruntime"
_DET = "ch_PP-OCRv4_det_infer.onnx"
_CLS = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
_REC = "ch_PP-OCRv4_rec_infer.onnx"
_GRAPH_OF_FILE = {_DET: "det", _CLS: "cls", _REC: "rec"}


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


_CURRENT = threading.local()  # the runner of the batch this thread is running
_CONSTRUCTING = threading.Lock()


class _GraphSession:
    """Stands in for rapidocr's ``OrtInferSession``: rapidocr keeps its pre/post-processing,
    and each of its three networks runs as a graph of the runner the engine bound to this
    thread. Reads the model's metadata (the recogniser's character list) from the ONNX file."""

    def __init__(self, config: dict[str, Any]) -> None:
        import onnx

        path = Path(config["model_path"])
        self.graph = _GRAPH_OF_FILE[path.name]
        model = onnx.load(str(path), load_external_data=False)
        self.input_name = model.graph.input[0].name
        self._metadata: dict[str, str] = {
            str(entry.key): str(entry.value) for entry in model.metadata_props
        }

    def __call__(self, input_content: np.ndarray) -> list[np.ndarray]:
        runner: GraphRunner = _CURRENT.runner
        return list(runner.run(self.graph, {self.input_name: input_content}).values())

    def have_key(self, key: str = "character") -> bool:
        return key in self._metadata

    def get_character_list(self, key: str = "character") -> list[str]:
        return self._metadata[key].splitlines()


def _rapidocr() -> Any:
    """rapidocr's engine with :class:`_GraphSession` in place of its ONNX Runtime sessions."""
    import rapidocr_onnxruntime.ch_ppocr_cls.text_cls as cls_module
    import rapidocr_onnxruntime.ch_ppocr_det.text_detect as det_module
    import rapidocr_onnxruntime.ch_ppocr_rec.text_recognize as rec_module
    from rapidocr_onnxruntime import RapidOCR

    modules = (det_module, cls_module, rec_module)
    with _CONSTRUCTING:  # the swap is module-wide: one construction at a time
        originals = [module.OrtInferSession for module in modules]
        try:
            for module in modules:
                module.OrtInferSession = _GraphSession
            return RapidOCR()
        finally:
            for module, original in zip(modules, originals, strict=True):
                module.OrtInferSession = original


class TextReader(ModelStage):
    """PP-OCRv4 (detection, direction classification, recognition) with rapidocr's pre- and
    post-processing; the three networks run on the device the stage is placed on."""

    name = "ocr"
    model_ids = ("pp-ocrv4",)
    runtimes = ("onnxruntime", "openvino")

    def __init__(
        self, *, runtime: str = "onnxruntime", cache_dir: Path | None = None, threads: int = 1
    ) -> None:
        super().__init__(runtime=runtime, cache_dir=cache_dir, threads=threads)
        self._engine: Any = None

    def _setup(self) -> None:
        self._engine = _rapidocr()

    def read(self, image: bytes, variant: str = "full") -> OcrResult:
        """Read the text in an image (PNG, JPEG, ... bytes).

        Raises:
            InvalidInputError: The image cannot be decoded.
        """
        found = self._call(variant, image)
        lines = tuple(
            OcrLine(line["text"], line["confidence"], tuple((x, y) for x, y in line["box"]))
            for line in found["lines"]
        )
        return OcrResult(found["text"], lines)

    def probe_payload(self) -> Any:
        return text_page_png(["Calibration page", "hetero 2026"])

    def profile(self, payload: Any) -> RequestProfile:
        return image_profile(payload)

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        """Each payload is one image's bytes; results are ``{"text": lines joined by
        newlines, "lines": [{"text", "confidence", "box": [[x, y] x 4]}]}``."""
        self.setup()
        _CURRENT.runner = runner
        try:
            return each(lambda image: self._read(variant, image), payloads)
        finally:
            _CURRENT.runner = None

    def _read(self, variant: str, image: bytes) -> dict[str, Any]:
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
        try:
            found, _ = self._engine(bgr)
        except ExecutionError:
            raise  # the device failed, not the image: the engine retries elsewhere
        except Exception as err:  # rapidocr raises bare Exceptions (ResizeImgError, ...)
            raise InvalidInputError(f"OCR could not process this image: {err}") from err
        lines: list[dict[str, Any]] = []
        texts: list[str] = []
        for box, text, score in found or ():
            corners = [[float(x) / scale, float(y) / scale] for x, y in box]
            texts.append(str(text))
            lines.append({"text": texts[-1], "confidence": float(score), "box": corners})
        return {"text": "\n".join(texts), "lines": lines}

    def _graphs(self, variant: str, graph_format: GraphFormat) -> Mapping[str, ComputeGraph]:
        """Detection carries the cost (hint for a 960x736 page; 640x480 for ``light``);
        direction classification and recognition add their weights."""
        pixels = 960 * 736 if variant == "full" else 640 * 480
        det = BandwidthHint(
            flops_per_item=4.0e3 * pixels,
            bytes_per_item=4.7e6 + 4.0 * 3 * pixels * 12,
            input_bytes=4 * 3 * pixels,
            output_bytes=4 * pixels,
            resident_bytes=int(16e6 * 2),
            batchable=False,
            max_batch=1,
        )
        models = package_file(_PACKAGE, "models")
        graphs = {"det": (_DET, det)}
        for name, file, size in (("cls", _CLS, 585_000), ("rec", _REC, 10_900_000)):
            hint = BandwidthHint(0.0, 0.0, resident_bytes=2 * size, batchable=False)
            graphs[name] = (file, hint)
        return {
            name: ComputeGraph(
                f"{self.name}/{name}",
                GraphFormat.ONNX,
                models / file,
                hint,
                metadata=(("model", "PP-OCRv4"), ("file", file)),
            )
            for name, (file, hint) in graphs.items()
        }
