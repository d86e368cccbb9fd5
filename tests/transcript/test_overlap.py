"""Where a re-decoded text goes on past the committed transcript (livemeet/transcript/overlap.py).

The cases are a review's: each made the first form (the committed words, exactly, as the
re-decode's first words) keep a turn whole, drop it, or cut it in the wrong place."""

from __future__ import annotations

import pytest

from livemeet.transcript.overlap import text_after_overlap, text_tokens


def test_tokens_are_words_and_cjk_characters_with_their_offsets() -> None:
    assert text_tokens("Wait — what, 我们 ok") == [
        ("wait", 0),
        ("what", 7),
        ("我", 13),
        ("们", 14),
        ("ok", 16),
    ]


@pytest.mark.parametrize(
    ("committed", "text", "rest"),
    [
        # the committed words again, then the new ones
        ("Charlie, november", "charlie november November charlie bravo", "November charlie bravo"),
        # punctuation alone is no token on either side ("—" was one only in the re-decode)
        ("wait — what", "wait — what happened then", "happened then"),
        # one word written otherwise: the run up to the committed end still aligns
        (
            "so we have 5 items on the list today and",
            "so we have five items on the list today and then the budget",
            "then the budget",
        ),
        # Chinese without spaces aligns per character
        ("我们今天讨论，", "我们今天讨论预算问题", "预算问题"),
        # a lone shared word is chance; the real overlap is found
        (
            "I said we gonna ship it and I",
            "I said we are going to ship it and I think so",
            "think so",
        ),
        # the committed text starts before the re-decoded turn: only its end matters
        ("so alpha bravo", "alpha bravo charlie", "charlie"),
        # all of it committed already
        ("alpha bravo charlie", "Alpha, bravo, charlie.", ""),
    ],
)
def test_text_after_the_committed_end(committed: str, text: str, rest: str) -> None:
    assert text_after_overlap(committed, text) == rest


@pytest.mark.parametrize(
    ("committed", "text"),
    [
        ("something else entirely", "charlie november bravo"),
        ("we said so and I", "I think so"),  # one word: chance
        ("", "anything"),
        ("anything", "—"),
    ],
)
def test_no_overlap_found(committed: str, text: str) -> None:
    assert text_after_overlap(committed, text) is None
