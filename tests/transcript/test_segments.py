"""The benchmarks' word-time convention (`word_end_times`)."""

from __future__ import annotations

import pytest

from livemeet.transcript.segments import Segment, word_end_times


def test_words_end_at_a_uniform_rate_over_their_segment() -> None:
    seg = Segment(1.0, 2.5, "S01", " one  two\tthree ")
    assert word_end_times(seg) == pytest.approx((1.5, 2.0, 2.5))
    assert word_end_times(seg)[-1] == 2.5  # exactly the segment's end


def test_a_segment_without_words_has_no_word_times() -> None:
    assert word_end_times(Segment(0.0, 1.0, "S01", "  ")) == ()
    assert word_end_times(Segment(0.0, 1.0, "S01", "你好")) == (1.0,)  # no space: one word
