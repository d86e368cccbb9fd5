"""Incremental detokenisation: byte-level exactness, golden model output, property tests."""

from __future__ import annotations

import random
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from livemeet.errors import ConfigError
from livemeet.models.tokenizer import load_tokenizer
from livemeet.transcript.detok import IncrementalDetokenizer
from livemeet.transcript.parser import TranscriptParser

# Golden greedy output of the real MOSS-TD model for a 40 s English clip (transformers
# tests/fixtures/moss_transcribe_diarize/expected_results_single_batch_over_30.json,
# "generated_ids" and "transcriptions"); ends with <|im_end|>.
GOLDEN_IDS = [
    58,
    15,
    13,
    22,
    21,
    60,
    42474,
    15,
    16,
    60,
    1096,
    2003,
    11,
    358,
    30696,
    311,
    10557,
    311,
    6359,
    847,
    1590,
    71543,
    2621,
    311,
    279,
    6995,
    17259,
    20,
    13,
    24,
    24,
    1457,
    20,
    13,
    24,
    24,
    60,
    42474,
    15,
    16,
    60,
    2701,
    304,
    279,
    13815,
    315,
    46508,
    1573,
    752,
    7873,
    23,
    13,
    24,
    19,
    1457,
    23,
    13,
    24,
    19,
    60,
    42474,
    15,
    16,
    60,
    1084,
    572,
    458,
    6638,
    311,
    1977,
    9702,
    498,
    7873,
    16,
    16,
    13,
    22,
    19,
    1457,
    16,
    16,
    13,
    22,
    19,
    60,
    42474,
    15,
    16,
    60,
    13139,
    582,
    3003,
    3884,
    7912,
    311,
    7912,
    11,
    476,
    18521,
    7230,
    518,
    678,
    11,
    847,
    20959,
    448,
    498,
    17259,
    16,
    22,
    13,
    16,
    19,
    1457,
    16,
    22,
    13,
    16,
    19,
    60,
    42474,
    15,
    16,
    60,
    279,
    3693,
    1251,
    11,
    304,
    5382,
    12026,
    323,
    8682,
    11,
    518,
    33224,
    323,
    389,
    8633,
    25945,
    17259,
    17,
    18,
    13,
    18,
    17,
    1457,
    17,
    18,
    13,
    18,
    17,
    60,
    42474,
    15,
    16,
    60,
    518,
    11623,
    388,
    11,
    323,
    389,
    28727,
    6277,
    700,
    12664,
    11,
    678,
    1493,
    20959,
    525,
    1128,
    614,
    8604,
    58,
    17,
    24,
    13,
    16,
    21,
    1457,
    17,
    24,
    13,
    16,
    21,
    60,
    42474,
    15,
    16,
    60,
    752,
    10745,
    11,
    8604,
    752,
    14606,
    11,
    323,
    8604,
    752,
    2087,
    7873,
    18,
    18,
    13,
    16,
    20,
    1457,
    18,
    18,
    13,
    16,
    20,
    60,
    42474,
    15,
    16,
    60,
    7209,
    1899,
    11,
    358,
    9498,
    504,
    498,
    7873,
    18,
    20,
    13,
    23,
    17,
    1457,
    18,
    20,
    13,
    23,
    17,
    60,
    42474,
    15,
    16,
    60,
    1446,
    1865,
    752,
    264,
    2664,
    4767,
    11,
    323,
    498,
    1865,
    752,
    264,
    2664,
    883,
    7873,
    18,
    24,
    13,
    21,
    19,
    1457,
    18,
    24,
    13,
    21,
    19,
    60,
    42474,
    15,
    16,
    60,
    6065,
    279,
    58,
    18,
    24,
    13,
    24,
    22,
    60,
    151645,
]
GOLDEN_TEXT = (
    "[0.76][S01] This week, I traveled to Chicago to deliver my final farewell address to the n"
    "ation,[5.99][5.99][S01] following in the tradition of presidents before me.[8.94][8.94][S0"
    "1] It was an opportunity to say thank you.[11.74][11.74][S01] Whether we've seen eye to ey"
    "e, or rarely agreed at all, my conversations with you,[17.14][17.14][S01] the American peo"
    "ple, in living rooms and schools, at farms and on factory floors,[23.32][23.32][S01] at di"
    "ners, and on distant military outposts, all these conversations are what have kept[29.16]["
    "29.16][S01] me honest, kept me inspired, and kept me going.[33.15][33.15][S01] Every day, "
    "I learned from you.[35.82][35.82][S01] You made me a better president, and you made me a b"
    "etter man.[39.64][39.64][S01] Over the[39.97]"
)

MIXED_SCRIPTS = (
    "abcxyz 0123456789 .,[]()?!\n你好世界第年的预算。こんにちはカタカナ안녕하세요ñéüßØ€😀🎉👍🏽"
)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer(None)


def _detok_all(tok: Tokenizer, ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tok)
    return [detok.push(i) for i in ids] + [detok.flush()]


def test_golden_output_streams_to_golden_text(tok: Tokenizer) -> None:
    pieces = _detok_all(tok, GOLDEN_IDS)
    assert "".join(pieces) == GOLDEN_TEXT
    assert pieces[-2:] == ["", ""]  # <|im_end|> is skipped; nothing left to flush


def test_golden_output_parses_while_streaming(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok)
    parser = TranscriptParser(audio_duration_s=40.0)
    confirmed = []
    for token_id in GOLDEN_IDS:
        confirmed += parser.feed(detok.push(token_id))
    confirmed += parser.feed(detok.flush())
    assert len(confirmed) == 9  # the tenth is held until close (confirmed one segment late)
    assert parser.pending() is not None and parser.pending().text == "Over the"
    segments = confirmed + parser.close()
    assert [s.start_s for s in segments] == [0.76, 5.99, 8.94, 11.74, 17.14, 23.32, 29.16, 33.15,
                                             35.82, 39.64]  # fmt: skip
    assert segments[-1].end_s == 39.97 and not segments[-1].flags
    assert {s.speaker for s in segments} == {"S01"}
    assert segments[0].text == (
        "This week, I traveled to Chicago to deliver my final farewell address to the nation,"
    )
    assert all(a.end_s == b.start_s for a, b in zip(segments, segments[1:], strict=False))


def test_cjk_split_across_tokens_is_held(tok: Tokenizer) -> None:
    # A rare CJK character is split into byte pieces by BPE; no piece may be emitted alone.
    text = "龘"  # U+9F98, 3 UTF-8 bytes
    ids = tok.encode(text).ids
    assert len(ids) > 1, "test needs a character that spans tokens"
    pieces = _detok_all(tok, ids)
    assert pieces[:-2] == [""] * (len(ids) - 1) and pieces[-2] == text
    assert all("\ufffd" not in p for p in pieces)


def test_special_tokens_are_skipped_and_think_kept(tok: Tokenizer) -> None:
    ids = [tok.token_to_id("<|im_start|>"), *tok.encode("hi").ids, tok.token_to_id("<think>")]
    ids += [tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|audio_pad|>")]
    assert "".join(_detok_all(tok, ids)) == tok.decode(ids) == "hi<think>"


def test_unfinished_character_flushes_as_replacement(tok: Tokenizer) -> None:
    ids = tok.encode("龘").ids[:1]
    detok = IncrementalDetokenizer(tok)
    assert detok.push(ids[0]) == ""
    assert detok.flush() == tok.decode(ids) == "\ufffd"
    assert detok.push(tok.encode("a").ids[0]) == "a"  # reusable after flush


def test_ids_outside_the_vocabulary_give_no_text(tok: Tokenizer) -> None:
    # Regression: a random-weight model sampled 151873 (an embedding padding row) and the
    # detokenizer raised, which took down the engine worker and every session on it.
    detok = IncrementalDetokenizer(tok)
    assert detok.push(151_873) == ""
    assert detok.push(10**7) == ""
    assert detok.num_unknown_ids == 2
    assert detok.push(tok.encode("a").ids[0]) == "a"
    assert tok.decode([151_873, *tok.encode("a").ids]) == "a"


def test_error_paths(tok: Tokenizer) -> None:
    toy = Tokenizer.from_str(tok.to_str())
    toy.decoder = None  # type: ignore[assignment]
    with pytest.raises(ConfigError):
        IncrementalDetokenizer(toy)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(MIXED_SCRIPTS), max_size=80))
def test_token_by_token_equals_decode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text).ids
    pieces = _detok_all(tok, ids)
    assert "".join(pieces) == tok.decode(ids) == unicodedata.normalize("NFC", text)
    assert all("\ufffd" not in p for p in pieces)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=151_671), max_size=30))
def test_arbitrary_ids_match_lossy_decode(tok: Tokenizer, ids: list[int]) -> None:
    # Model output need not be valid UTF-8; the replacement characters must match decode()'s.
    assert "".join(_detok_all(tok, ids)) == tok.decode(ids)


def test_random_byte_splits_of_emoji_runs(tok: Tokenizer) -> None:
    rng = random.Random(7)
    for _ in range(50):
        text = "".join(rng.choice("😀🎉👍🏽龘𠀋é a") for _ in range(20))
        ids = tok.encode(text).ids
        assert "".join(_detok_all(tok, ids)) == text
