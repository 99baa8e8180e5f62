"""PP-OCRv4: rendered text reads back, on ONNX Runtime and OpenVINO; bad input."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hetero.framework.errors import InvalidInputError
from hetero.models.ocr import TextReader

LINES = ["Hello Accelerator 2026", "Total 42.50 EUR"]


def _squash(text: str) -> str:
    return "".join(text.split()).lower()


def test_rendered_text_reads_back(reader: TextReader, render_text: Callable[..., bytes]) -> None:
    result = reader.read(render_text(LINES))
    assert [_squash(line.text) for line in result.lines] == [_squash(line) for line in LINES]
    assert all(line.confidence > 0.8 for line in result.lines)
    first, second = result.lines
    assert first.box[0][1] < second.box[0][1]  # reading order, top to bottom
    assert _squash(result.text) == _squash("".join(LINES))


def test_light_variant_boxes_are_in_original_pixels(
    reader: TextReader, render_text: Callable[..., bytes]
) -> None:
    page = render_text(LINES, width=2000, font_size=80)
    full = reader.read(page)
    light = reader.read(page, variant="light")
    assert _squash(light.text) == _squash(full.text) == _squash("".join(LINES))
    for a, b in zip(full.lines, light.lines, strict=True):
        assert abs(a.box[0][0] - b.box[0][0]) < 12
        assert abs(a.box[2][1] - b.box[2][1]) < 12


def test_openvino_reads_the_same(reader: TextReader, render_text: Callable[..., bytes]) -> None:
    stage = TextReader(runtime="openvino", cache_dir=reader.cache_dir)
    page = render_text(LINES)
    assert stage.read(page).text == reader.read(page).text
    stage.close()


def test_blank_page_has_no_text(reader: TextReader, render_text: Callable[..., bytes]) -> None:
    result = reader.read(render_text([]))
    assert result.text == ""
    assert result.lines == ()


@pytest.mark.parametrize("data", [b"", b"GIF89a broken"])
def test_undecodable_image_is_invalid_input(reader: TextReader, data: bytes) -> None:
    with pytest.raises(InvalidInputError, match="image"):
        reader.read(data)


def test_a_sliver_of_an_image_is_invalid_input_not_an_engine_crash(reader: TextReader) -> None:
    import io

    from PIL import Image

    for size in ((3000, 1), (1, 3000)):
        buffer = io.BytesIO()
        Image.new("RGB", size, "white").save(buffer, "PNG")
        with pytest.raises(InvalidInputError, match="aspect ratio"):
            reader.read(buffer.getvalue())
