"""cpCER/cpWER and delta CER: oracle vectors, meeteval examples, brute-force permutations."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from livemeet.errors import InvalidRequest
from livemeet.eval.cp import assign_streams, cp_error_rate, delta_error_rate, orc_error_rate
from livemeet.eval.io import TextSegment, load_segments
from livemeet.eval.text import NO_NORMALIZATION, TokenUnit
from livemeet.eval.wer import ErrorCounts, edit_distance


def test_oracle_cjk_vectors(shared_data: Path) -> None:
    ref = load_segments(shared_data / "oracle-vectors" / "cjk_ref.stm")
    hyp = load_segments(shared_data / "oracle-vectors" / "cjk_hyp.stm")
    result = delta_error_rate(ref, hyp, TokenUnit.MIXED)
    assert result.cp.counts == ErrorCounts(
        substitutions=1, deletions=2, insertions=2, ref_length=10
    )
    assert result.cp.rate == pytest.approx(0.5, abs=1e-6)
    assert result.cp.sessions[0].assignment == {"A": "S02", "B": "S01"}
    assert result.agnostic.rate == pytest.approx(0.1, abs=1e-6)
    assert result.delta == pytest.approx(0.4, abs=1e-6)


@pytest.mark.parametrize("options", [NO_NORMALIZATION, None])
def test_meeteval_examples_cpwer(shared_data: Path, options) -> None:  # type: ignore[no-untyped-def]
    folder = shared_data / "meeteval-examples"
    extra = () if options is None else (options,)
    result = cp_error_rate(
        load_segments(folder / "ref.stm"), load_segments(folder / "hyp.stm"), TokenUnit.WORD, *extra
    )
    assert (result.counts.errors, result.counts.ref_length) == (25, 92)
    assert result.rate == pytest.approx(25 / 92, abs=1e-6)
    per_session = {s.session: (s.counts.errors, s.counts.ref_length) for s in result.sessions}
    assert per_session == {"recordingA": (2, 62), "recordingB": (23, 30)}
    recording_b = result.sessions[1]
    assert recording_b.assignment == {"Alice": "Bob"}
    assert (recording_b.missed_speakers, recording_b.falarm_speakers) == (0, 1)


def test_seglst_gives_the_same_cpwer(shared_data: Path) -> None:
    folder = shared_data / "meeteval-examples"
    result = cp_error_rate(
        load_segments(folder / "ref.seglst.json"),
        load_segments(folder / "hyp.seglst.json"),
        TokenUnit.WORD,
    )
    assert (result.counts.errors, result.counts.ref_length) == (25, 92)


def brute_force_cp(ref: dict[str, list[str]], hyp: dict[str, list[str]]) -> int:
    """Minimum over every injective pairing, empty streams padding the smaller side."""
    size = max(len(ref), len(hyp))
    refs = list(ref.values()) + [[]] * (size - len(ref))
    hyps = list(hyp.values()) + [[]] * (size - len(hyp))
    return min(
        sum(edit_distance(r, hyps[j]) for r, j in zip(refs, perm, strict=True))
        for perm in itertools.permutations(range(size))
    )


def test_hungarian_matches_brute_force_with_unequal_speaker_counts() -> None:
    rng = random.Random(5)
    vocab = list("甲乙丙丁戊")
    for _ in range(200):
        n_ref, n_hyp = rng.randint(1, 4), rng.randint(1, 4)
        ref = {f"r{i}": rng.choices(vocab, k=rng.randint(0, 8)) for i in range(n_ref)}
        hyp = {f"h{i}": rng.choices(vocab, k=rng.randint(0, 8)) for i in range(n_hyp)}
        pairs = assign_streams(ref, hyp)
        assert sum(p.counts.errors for p in pairs) == brute_force_cp(ref, hyp)
        assert sorted(p.ref_speaker for p in pairs if p.ref_speaker) == sorted(ref)
        assert sorted(p.hyp_speaker for p in pairs if p.hyp_speaker) == sorted(hyp)
        assert sum(p.hyp_speaker is None for p in pairs) == max(0, n_ref - n_hyp)


def test_extra_hypothesis_speaker_is_all_insertions() -> None:
    ref = [TextSegment("m", "A", 0, 1, "你好")]
    hyp = [TextSegment("m", "S01", 0, 1, "你好"), TextSegment("m", "S02", 1, 2, "再见啊")]
    result = cp_error_rate(ref, hyp)
    assert result.counts == ErrorCounts(0, 0, 3, 2)
    assert result.sessions[0].assignment == {"A": "S01"}


def test_speaker_streams_are_concatenated_in_time_order() -> None:
    ref = [TextSegment("m", "A", 5, 6, "c d"), TextSegment("m", "A", 0, 1, "a b")]
    hyp = [TextSegment("m", "X", 0, 6, "a b c d")]
    assert cp_error_rate(ref, hyp, TokenUnit.WORD).counts.errors == 0


def test_unlabelled_speaker_stream_is_scored() -> None:
    # regression: the empty speaker label "" (transcript JSON without speakers) was taken for
    # "no partner" and its stream scored as empty
    ref = [TextSegment("m", "A", 0, 1, "你好")]
    hyp = [TextSegment("m", "", 0, 1, "你坏")]
    result = cp_error_rate(ref, hyp)
    assert result.counts == ErrorCounts(1, 0, 0, 2)
    assert result.sessions[0].assignment == {"A": ""}


def test_orc_expected_values(shared_data: Path) -> None:
    cjk = shared_data / "oracle-vectors"
    orc = orc_error_rate(load_segments(cjk / "cjk_ref.stm"), load_segments(cjk / "cjk_hyp.stm"))
    assert orc.rate == pytest.approx(0.1, abs=1e-6)
    folder = shared_data / "meeteval-examples"
    ref, hyp = load_segments(folder / "ref.stm"), load_segments(folder / "hyp.stm")
    orc = orc_error_rate(ref, hyp, TokenUnit.WORD, NO_NORMALIZATION)
    assert (orc.errors, orc.ref_length) == (9, 92)


def test_orc_matches_brute_force_over_segment_assignments() -> None:
    rng = random.Random(11)
    vocab = list("甲乙丙")
    for _ in range(60):
        segs = [rng.choices(vocab, k=rng.randint(0, 3)) for _ in range(rng.randint(1, 4))]
        streams = [rng.choices(vocab, k=rng.randint(0, 6)) for _ in range(rng.randint(1, 3))]
        best = min(
            sum(
                edit_distance(
                    [t for s, c in zip(segs, choice, strict=True) if c == k for t in s], stream
                )
                for k, stream in enumerate(streams)
            )
            for choice in itertools.product(range(len(streams)), repeat=len(segs))
        )
        ref = [TextSegment("m", "A", float(i), i + 0.5, " ".join(s)) for i, s in enumerate(segs)]
        hyp = [TextSegment("m", f"h{k}", 0.0, 1.0, " ".join(s)) for k, s in enumerate(streams)]
        assert orc_error_rate(ref, hyp, TokenUnit.WORD).errors == best


def test_orc_refuses_large_inputs() -> None:
    ref = [TextSegment("m", "A", float(i), i + 1.0, "字" * 50) for i in range(40)]
    hyp = [TextSegment("m", f"h{k}", 0.0, 1.0, "字" * 200) for k in range(3)]
    with pytest.raises(InvalidRequest, match="DP cells"):
        orc_error_rate(ref, hyp)
