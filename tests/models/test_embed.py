"""all-MiniLM-L6-v2: semantic similarity, normalisation, padding, runtimes, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.framework.errors import InvalidInputError
from hetero.models.embed import TextEmbedder

TEXTS = ["A man is eating food.", "Someone is having a meal.", "The stock market fell sharply."]


def test_related_sentences_are_closer(embedder: TextEmbedder) -> None:
    vectors = embedder.embed(TEXTS)
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    related, unrelated = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
    assert related > unrelated + 0.3


def test_padding_in_a_batch_does_not_change_a_vector(embedder: TextEmbedder) -> None:
    short, long = (
        "Hi.",
        "A considerably longer sentence that needs many more tokens than the other.",
    )
    batch = embedder.embed([short, long])
    np.testing.assert_allclose(batch[0], embedder.embed([short])[0], atol=1e-5)
    np.testing.assert_allclose(batch[1], embedder.embed([long])[0], atol=1e-5)


def test_openvino_and_torch_match_onnxruntime(
    embedder: TextEmbedder, embedder_ov: TextEmbedder
) -> None:
    want = embedder.embed(TEXTS)
    np.testing.assert_allclose(embedder_ov.embed(TEXTS), want, atol=1e-3)
    torch_stage = TextEmbedder(runtime="torch", cache_dir=embedder.cache_dir)
    np.testing.assert_allclose(torch_stage.embed(TEXTS), want, atol=1e-3)
    torch_stage.close()


def test_long_text_is_truncated_not_rejected(embedder: TextEmbedder) -> None:
    text = "word " * 1000
    assert embedder.count_tokens(text) > 1000
    assert embedder.embed([text]).shape == (1, 384)


def test_count_tokens_includes_cls_and_sep(embedder: TextEmbedder) -> None:
    assert embedder.count_tokens("hello world") == 4


@pytest.mark.parametrize("texts", [[""], ["fine", "   "]])
def test_empty_text_is_invalid_input(embedder: TextEmbedder, texts: list[str]) -> None:
    with pytest.raises(InvalidInputError, match="empty"):
        embedder.embed(texts)


def test_no_texts_give_an_empty_matrix(embedder: TextEmbedder) -> None:
    assert embedder.embed([]).shape == (0, 384)
