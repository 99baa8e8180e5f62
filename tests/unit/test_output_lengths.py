"""The expected output length placement assumes for a new generation: learnt from the ones
that finished, nothing before the first."""

from __future__ import annotations

from hetero.framework.scheduler.output_lengths import HORIZON, OutputLengths


def test_the_expected_length_is_the_mean_then_follows_recent_ones() -> None:
    lengths = OutputLengths()
    assert lengths.expected("llm") == 0  # nothing finished: placement does without it
    for tokens in (100, 200, 300):
        lengths.observe("llm", tokens)
    assert lengths.expected("llm") == 200
    assert lengths.expected("other") == 0  # per stage
    for _ in range(10 * HORIZON):  # the stream changed: the estimate follows it
        lengths.observe("llm", 20)
    assert lengths.expected("llm") == 20
