"""Per-segment token pieces (livemeet/transcript/pieces.py) against tokenizing joined text."""

from __future__ import annotations

import pytest

from livemeet.models.tokenizer import load_tokenizer
from livemeet.transcript.parser import render_segment
from livemeet.transcript.pieces import join_pieces, segment_pieces, splits_after_digits
from livemeet.transcript.segments import Segment


@pytest.fixture(scope="module")
def encode():  # type: ignore[no-untyped-def]
    tok = load_tokenizer(None)
    return lambda text: list(tok.encode(text, add_special_tokens=False).ids)


def test_joined_pieces_are_the_joined_texts_ids(encode) -> None:  # type: ignore[no-untyped-def]
    """Runs of segments whose texts put letters, digits, punctuation, CJK and spaces against
    the stamps: the pieces give exactly the ids of the joined text, with or without a `]`
    before the run and after it."""
    texts = ["Okay.", "12", "你好", "", "a]b[c", " spaced  out ", "x" * 40, "Mr. 5:30pm"]
    segs = [
        Segment(start_s=1.37 * i, end_s=1.37 * i + 0.91, speaker=f"S{1 + i % 11:02d}", text=t)
        for i, t in enumerate(texts)
    ]
    pieces = [segment_pieces(encode, render_segment(s)) for s in segs]
    close = encode("]")
    for first in range(len(segs)):
        for last in range(first + 1, len(segs) + 1):
            text = "".join(render_segment(s) for s in segs[first:last])
            run = pieces[first:last]
            assert join_pieces(run) == encode(text[:-1])
            assert join_pieces(run) + close == encode(text)
            assert join_pieces(run, after_close=True) + close == encode("]" + text)


def test_the_premise_is_checked_on_the_tokenizer(encode) -> None:  # type: ignore[no-untyped-def]
    assert splits_after_digits(encode)
    # a tokenizer that merges across digits (whole words, digits included) fails the probe
    word_ids: dict[str, int] = {}

    def by_word(text: str) -> list[int]:
        return [word_ids.setdefault(w, len(word_ids)) for w in text.split()]

    assert not splits_after_digits(by_word)


def test_only_rendered_segments_are_split(encode) -> None:  # type: ignore[no-untyped-def]
    for bad in ["", "]", "[1.00][S01] hi", "[1.00][S01] hi[x]"]:
        with pytest.raises(ValueError, match="rendered segment"):
            segment_pieces(encode, bad)
