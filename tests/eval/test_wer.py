"""Edit-distance counts against an independent DP and jiwer; speaker-agnostic WER/CER."""

from __future__ import annotations

import random
from pathlib import Path

import jiwer
import pytest
from hypothesis import given
from hypothesis import strategies as st

from livemeet.errors import InvalidRequest
from livemeet.eval.io import DEFAULT_SESSION, TextSegment, load_segments
from livemeet.eval.text import NO_NORMALIZATION, TokenUnit, tokenize
from livemeet.eval.wer import (
    EditOp,
    ErrorCounts,
    align,
    count_errors,
    edit_distance,
    error_rate,
    match_sessions,
)


def reference_distance(ref: list[str], hyp: list[str]) -> int:
    """Textbook Wagner-Fischer table, written independently of the code under test."""
    table = [
        [i + j if i == 0 or j == 0 else 0 for j in range(len(hyp) + 1)] for i in range(len(ref) + 1)
    ]
    for i in range(1, len(ref) + 1):
        for j in range(1, len(hyp) + 1):
            table[i][j] = min(
                table[i - 1][j] + 1,
                table[i][j - 1] + 1,
                table[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]),
            )
    return table[-1][-1]


def jiwer_counts(ref: list[str], hyp: list[str]) -> ErrorCounts:
    """jiwer's counts for the same token lists (tokens hold no spaces, so joining is lossless)."""
    out = jiwer.process_words(" ".join(ref), " ".join(hyp))
    return ErrorCounts(out.substitutions, out.deletions, out.insertions, len(ref))


VOCAB = ["我", "们", "用", "python", "写", "代码", "the", "a", "meeting", "好"]


@given(st.lists(st.sampled_from(VOCAB), max_size=12), st.lists(st.sampled_from(VOCAB), max_size=12))
def test_counts_are_a_minimum_alignment(ref: list[str], hyp: list[str]) -> None:
    counts = count_errors(ref, hyp)
    assert counts.errors == edit_distance(ref, hyp) == reference_distance(ref, hyp)
    assert counts.deletions - counts.insertions == len(ref) - len(hyp)
    assert counts.hyp_length == len(hyp)
    pairs = align(ref, hyp)
    assert [p.ref for p in pairs if p.ref is not None] == ref
    assert [p.hyp for p in pairs if p.hyp is not None] == hyp
    assert sum(p.op is not EditOp.MATCH for p in pairs) == counts.errors


def _perturb(tokens: list[str], rng: random.Random) -> list[str]:
    out = []
    for token in tokens:
        roll = rng.random()
        if roll < 0.1:
            continue
        out.append(rng.choice(VOCAB) if roll < 0.2 else token)
        if roll > 0.92:
            out.append(rng.choice(VOCAB))
    return out


def test_random_sentences_match_jiwer() -> None:
    rng = random.Random(1234)
    for _ in range(300):
        ref = [rng.choice(VOCAB) for _ in range(rng.randint(1, 40))]
        hyp = _perturb(ref, rng)
        ours = count_errors(ref, hyp)
        assert ours == jiwer_counts(ref, hyp)
        assert ours.rate == pytest.approx(jiwer.wer(" ".join(ref), " ".join(hyp)), abs=1e-12)


def _kaldi_text(path: Path) -> str:
    return path.read_text(encoding="utf-8").split(maxsplit=1)[1]


def test_data_texts_match_jiwer(shared_data: Path) -> None:
    rng = random.Random(7)
    texts = [
        _kaldi_text(shared_data / "jfk" / "text"),
        _kaldi_text(shared_data / "aishell1" / "text"),
        _kaldi_text(shared_data / "librispeech-lhotse" / "text"),
    ]
    for unit in TokenUnit:
        for text in texts:
            ref = tokenize(text, unit)
            hyp = _perturb(ref, rng)
            assert count_errors(ref, hyp) == jiwer_counts(ref, hyp)
    refs = (shared_data / "meeteval-examples" / "text_ref").read_text().splitlines()
    hyps = (shared_data / "meeteval-examples" / "text_hyp").read_text().splitlines()
    total = ErrorCounts()
    for r, h in zip(refs, hyps, strict=True):
        total = total + count_errors(r.split()[1:], h.split()[1:])
    theirs = jiwer.process_words(
        [r.split(maxsplit=1)[1] for r in refs], [h.split(maxsplit=1)[1] for h in hyps]
    )
    assert (total.substitutions, total.deletions, total.insertions) == (
        theirs.substitutions,
        theirs.deletions,
        theirs.insertions,
    )
    assert total.rate == pytest.approx(theirs.wer, abs=1e-12)


def test_aishell_cer_counts_characters(shared_data: Path) -> None:
    text = _kaldi_text(shared_data / "aishell1" / "text")
    ref = tokenize(text)
    assert len(ref) == len("".join(text.split())) == 13
    counts = count_errors(ref, tokenize("甚至出现交易几乎停止的情况"))
    assert counts == ErrorCounts(substitutions=1, deletions=0, insertions=0, ref_length=13)


def test_siso_wer_of_meeteval_examples(shared_data: Path) -> None:
    folder = shared_data / "meeteval-examples"
    ref = load_segments(folder / "ref_siso.stm")
    hyp = load_segments(folder / "hyp_siso.stm")
    for options in (NO_NORMALIZATION, None):
        result = error_rate(ref, hyp, TokenUnit.WORD, *(() if options is None else (options,)))
        assert (result.counts.errors, result.counts.ref_length) == (2, 31)
        assert result.rate == pytest.approx(2 / 31, abs=1e-6)
        assert [s.session for s in result.sessions] == ["recordingA", "recordingC"]


def test_speaker_agnostic_cer_orders_segments_by_start() -> None:
    ref = [TextSegment("m", "A", 2.0, 3.0, "会议"), TextSegment("m", "B", 0.0, 1.0, "你好")]
    hyp = [TextSegment("m", "X", 0.0, 3.0, "你好会议")]
    assert error_rate(ref, hyp).counts == ErrorCounts(0, 0, 0, 4)


def test_missing_sessions_count_as_deletions_or_insertions() -> None:
    ref = [TextSegment("a", "A", 0, 1, "one two")]
    hyp = [TextSegment("b", "A", 0, 1, "three")]
    result = error_rate(ref, hyp)
    assert result.counts == ErrorCounts(0, 2, 1, 2)
    assert ErrorCounts(0, 0, 1, 0).rate == float("inf") and ErrorCounts().rate == 0.0


def test_match_sessions_names_the_ids_of_one_side_only() -> None:
    def seg(session: str) -> TextSegment:
        return TextSegment(session, "A", 0.0, 1.0, "x")

    match = match_sessions([seg("a"), seg("b"), seg("b")], [seg("b"), seg("c"), seg("d")])
    assert (match.matched, match.ref_only, match.hyp_only) == (("b",), ("a",), ("c", "d"))
    assert not match.disjoint
    assert match_sessions([seg("a")], [seg("x")]).disjoint
    assert not match_sessions([seg("a")], []).disjoint  # an empty hypothesis: all deletions
    # a side without ids pairs with the other's only session (`pair_sessions`)
    assert match_sessions([seg("a")], [seg(DEFAULT_SESSION)]).matched == ("a",)


def test_default_session_pairs_with_the_only_other_session() -> None:
    ref = [TextSegment("meeting7", "A", 0, 1, "hello world")]
    hyp = [TextSegment(DEFAULT_SESSION, "S01", 0, 1, "hello word")]
    result = error_rate(ref, hyp)
    assert result.counts.errors == 1 and result.sessions[0].session == "meeting7"
    two = ref + [TextSegment("meeting8", "A", 0, 1, "x")]
    with pytest.raises(InvalidRequest, match="cannot be matched to 2 sessions"):
        error_rate(two, hyp)
