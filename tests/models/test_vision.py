"""EfficientNet-Lite0: labels, embeddings, batching, runtimes, bad input."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from hetero.framework.errors import InvalidInputError
from hetero.framework.graph import GraphFormat
from hetero.models.vision import VisionEncoder


def test_crossword_is_labelled_crossword(vision: VisionEncoder, crossword_png: bytes) -> None:
    (result,) = vision.encode([crossword_png])
    label, prob = result.labels[0]
    assert label == "crossword"
    assert prob > 0.5
    assert len(result.labels) == 5
    assert [p for _, p in result.labels] == sorted((p for _, p in result.labels), reverse=True)
    assert (result.width, result.height) == (300, 300)
    assert result.embedding.shape == (1280,)
    assert result.embedding.dtype == np.float32
    assert np.all(result.embedding >= 0)  # pooled ReLU6 activations


def test_a_batch_gives_what_single_images_give(
    vision: VisionEncoder, crossword_png: bytes, render_text: Callable[..., bytes]
) -> None:
    other = render_text(["Hello"])
    batch = vision.encode([crossword_png, other])
    alone = [vision.encode([crossword_png])[0], vision.encode([other])[0]]
    for got, want in zip(batch, alone, strict=True):
        np.testing.assert_allclose(got.embedding, want.embedding, atol=1e-4)
        assert got.labels[0][0] == want.labels[0][0]
    assert batch[1].width == 700
    assert not np.allclose(batch[0].embedding, batch[1].embedding, atol=1e-2)


def test_light_variant_runs_smaller_input(vision: VisionEncoder, crossword_png: bytes) -> None:
    (full,) = vision.encode([crossword_png])
    (light,) = vision.encode([crossword_png], variant="light")
    assert "crossword" in [label for label, _ in light.labels]
    assert light.embedding.shape == (1280,)
    assert not np.allclose(full.embedding, light.embedding)
    light, full = vision.graphs("light")["encoder"], vision.graphs("full")["encoder"]
    assert light.hint.flops_per_item < full.hint.flops_per_item


def test_openvino_f32_matches_onnxruntime(
    vision: VisionEncoder, vision_ov: VisionEncoder, crossword_png: bytes
) -> None:
    (ort,) = vision.encode([crossword_png])
    (ov,) = vision_ov.encode([crossword_png])
    np.testing.assert_allclose(ov.embedding, ort.embedding, atol=1e-3)
    assert [label for label, _ in ov.labels] == [label for label, _ in ort.labels]
    np.testing.assert_allclose([p for _, p in ov.labels], [p for _, p in ort.labels], atol=1e-3)


def test_torch_matches_onnxruntime(vision: VisionEncoder, crossword_png: bytes) -> None:
    stage = VisionEncoder(runtime="torch", cache_dir=vision.cache_dir)
    (torch_result,) = stage.encode([crossword_png])
    (ort,) = vision.encode([crossword_png])
    np.testing.assert_allclose(torch_result.embedding, ort.embedding, atol=1e-3)
    stage.close()


def test_graph_points_at_the_exported_onnx(vision: VisionEncoder) -> None:
    graph = vision.graphs()["encoder"]
    assert graph.format is GraphFormat.ONNX
    assert graph.source == vision.onnx_path
    assert vision.onnx_path.stat().st_size > 10_000_000
    assert graph.hint.batchable


@pytest.mark.parametrize("data", [b"", b"not an image", b"\x89PNG\r\n\x1a\n" + b"\0" * 40])
def test_undecodable_images_are_invalid_input(vision: VisionEncoder, data: bytes) -> None:
    with pytest.raises(InvalidInputError, match="image 1"):
        vision.encode([_tiny_png(), data])


def test_truncated_png_is_invalid_input(vision: VisionEncoder, crossword_png: bytes) -> None:
    with pytest.raises(InvalidInputError):
        vision.encode([crossword_png[: len(crossword_png) // 2]])


def test_no_images_no_results(vision: VisionEncoder) -> None:
    assert vision.encode([]) == []


def _tiny_png() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "white").save(buffer, "PNG")
    return buffer.getvalue()
