"""DER against the expected values of md-eval/pyannote and an independent frame-level scorer."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import numpy as np
import pytest

from livemeet.errors import InvalidRequest
from livemeet.eval.der import diarization_error_rate
from livemeet.eval.io import SpeakerTurn, TextSegment, UemRegion, load_turns, load_uem


@pytest.fixture(scope="module")
def meeteval_files(shared_data: Path):  # type: ignore[no-untyped-def]
    folder = shared_data / "meeteval-examples"
    return (
        load_turns(folder / "ref.rttm"),
        load_turns(folder / "hyp.rttm"),
        load_uem(folder / "uem.uem"),
    )


@pytest.fixture(scope="module")
def ami_files(shared_data: Path):  # type: ignore[no-untyped-def]
    folder = shared_data / "ami-pyannote-debug"
    return (
        load_turns(folder / "debug.test.rttm"),
        load_turns(folder / "hyp_perturbed.test.rttm"),
        load_uem(folder / "debug.test.uem"),
    )


@pytest.mark.parametrize(("collar_s", "expected"), [(0.0, 0.425), (0.25, 0.375)])
def test_meeteval_examples_with_uem(meeteval_files, collar_s: float, expected: float) -> None:  # type: ignore[no-untyped-def]
    ref, hyp, uem = meeteval_files
    assert diarization_error_rate(ref, hyp, uem, collar_s).der == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(("collar_s", "expected"), [(0.0, 0.54), (0.25, 0.60)])
def test_meeteval_examples_without_uem_like_pyannote(
    meeteval_files, collar_s: float, expected: float
) -> None:  # type: ignore[no-untyped-def]
    ref, hyp, _ = meeteval_files
    assert diarization_error_rate(ref, hyp, None, collar_s).der == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(("collar_s", "expected"), [(0.0, 0.314228), (0.25, 0.259491)])
def test_ami_debug_perturbed(ami_files, collar_s: float, expected: float) -> None:  # type: ignore[no-untyped-def]
    ref, hyp, uem = ami_files
    result = diarization_error_rate(ref, hyp, uem, collar_s)
    assert result.der == pytest.approx(expected, abs=1e-6)
    c = result.components
    assert c.error_s == pytest.approx(c.missed_s + c.false_alarm_s + c.confusion_s)
    assert dict(result.sessions[0].mapping)["MEE071"] == "spk1"


def test_ami_debug_skip_overlap_like_pyannote(ami_files) -> None:  # type: ignore[no-untyped-def]
    ref, hyp, uem = ami_files
    result = diarization_error_rate(ref, hyp, uem, 0.25, skip_overlap=True)
    assert result.der == pytest.approx(0.089034, abs=1e-6)


@pytest.mark.parametrize(
    ("collar_s", "skip_overlap", "expected"), [(0.25, True, 0.213152), (0.25, False, 0.259491)]
)
def test_ami_debug_with_md_eval_mapping(ami_files, collar_s, skip_overlap, expected) -> None:  # type: ignore[no-untyped-def]
    """md-eval-22's figures for these files (../shared/data/README.md): `-1 -c 0.25` differs
    from pyannote's 0.089034 by its speaker mapping alone."""
    ref, hyp, uem = ami_files
    result = diarization_error_rate(ref, hyp, uem, collar_s, skip_overlap, mapping="md-eval")
    assert result.der == pytest.approx(expected, abs=1e-6)


def test_an_unknown_mapping_is_refused(ami_files) -> None:  # type: ignore[no-untyped-def]
    ref, hyp, uem = ami_files
    with pytest.raises(ValueError, match="mapping must be one of pyannote, md-eval"):
        diarization_error_rate(ref, hyp, uem, mapping="dscore")


def test_reference_against_itself_is_zero(ami_files) -> None:  # type: ignore[no-untyped-def]
    ref, _, uem = ami_files
    renamed = [SpeakerTurn(t.session, "x" + t.speaker, t.start_s, t.end_s) for t in ref]
    result = diarization_error_rate(ref, renamed, uem, 0.0)
    assert result.der == 0.0 and result.components.total_s > 0


def frame_der(ref, hyp, uem, collar_s: float, step_s: float = 0.001) -> float:  # type: ignore[no-untyped-def]
    """DER on a 1 ms frame grid with the mapping found by trying every permutation."""
    end = max(r.end_s for r in uem)
    centres = (np.arange(int(round(end / step_s))) + 0.5) * step_s

    def on(turns, speaker):  # type: ignore[no-untyped-def]
        mask = np.zeros(len(centres), bool)
        for t in turns:
            if t.speaker == speaker:
                mask |= (centres > t.start_s) & (centres < t.end_s)
        return mask

    scored = np.zeros(len(centres), bool)
    for r in uem:
        scored |= (centres > r.start_s) & (centres < r.end_s)
    for t in ref:
        for b in (t.start_s, t.end_s):
            scored &= np.abs(centres - b) >= collar_s
    ref_spk = sorted({t.speaker for t in ref})
    hyp_spk = sorted({t.speaker for t in hyp})
    R = np.array([on(ref, s) for s in ref_spk]) & scored
    H = np.array([on(hyp, s) for s in hyp_spk]) & scored
    n_ref, n_hyp = R.sum(0), H.sum(0)
    size = max(len(ref_spk), len(hyp_spk))
    best = 0
    for perm in itertools.permutations(range(size), len(ref_spk)):
        best = max(
            best, sum(int((R[i] & H[j]).sum()) for i, j in enumerate(perm) if j < len(hyp_spk))
        )
    errors = np.maximum(n_ref, n_hyp).sum() - best
    return errors / n_ref.sum()


def _random_turns(rng: random.Random, prefix: str, n_speakers: int) -> list[SpeakerTurn]:
    turns = []
    for k in range(n_speakers):
        t = rng.randint(0, 500) / 100
        while t < 9:
            length = rng.randint(20, 300) / 100
            turns.append(SpeakerTurn("s", f"{prefix}{k}", t, min(t + length, 10.0)))
            t += length + rng.randint(10, 300) / 100
    return turns


@pytest.mark.parametrize("seed", range(8))
def test_matches_frame_level_scorer_on_random_turns(seed: int) -> None:
    rng = random.Random(seed)
    ref = _random_turns(rng, "r", rng.randint(1, 3))
    hyp = _random_turns(rng, "h", rng.randint(1, 3))
    uem = [UemRegion("s", 0.5, 6.0), UemRegion("s", 7.0, 10.0)]
    for collar_s in (0.0, 0.25):
        ours = diarization_error_rate(ref, hyp, uem, collar_s).der
        assert ours == pytest.approx(frame_der(ref, hyp, uem, collar_s), abs=2e-3)


def test_mapping_is_made_inside_the_scored_region() -> None:
    """pyannote's mapping, not md-eval's: A's three touching turns lie wholly in collars, so
    only B's time is scored and X maps to B (DER 0). md-eval maps before the collars (X: 1.5 s
    with A, 1.0 s with B), so `md-eval -c 0.25` scores B's 0.5 s as confusion: DER 1.0."""
    ref = [
        SpeakerTurn("s", "A", 0.0, 0.5),
        SpeakerTurn("s", "A", 0.5, 1.0),
        SpeakerTurn("s", "A", 1.0, 1.5),
        SpeakerTurn("s", "B", 5.0, 6.0),
    ]
    hyp = [SpeakerTurn("s", "X", 0.0, 1.5), SpeakerTurn("s", "X", 5.0, 6.0)]
    uem = [UemRegion("s", 0.0, 6.0)]
    collared = diarization_error_rate(ref, hyp, uem, 0.25)
    assert collared.sessions[0].mapping == (("B", "X"),)
    assert collared.der == 0.0 and collared.components.total_s == pytest.approx(0.5)
    scored_all = diarization_error_rate(ref, hyp, uem, 0.0)
    assert scored_all.sessions[0].mapping == (("A", "X"),)
    assert scored_all.components.confusion_s == pytest.approx(1.0)
    assert scored_all.der == pytest.approx(1.0 / 2.5)
    md_eval = diarization_error_rate(ref, hyp, uem, 0.25, mapping="md-eval")
    assert md_eval.sessions[0].mapping == (("A", "X"),)
    assert md_eval.der == 1.0 and md_eval.components.confusion_s == pytest.approx(0.5)


def test_without_a_uem_hypothesis_speech_before_the_reference_is_false_alarm() -> None:
    """The region is the extent of both sides (pyannote, dscore), not of the reference alone
    (md-eval, which scores this 0.0: meeteval issue 97)."""
    ref = [SpeakerTurn("rec", "spk01", 5.0, 10.0), SpeakerTurn("rec", "spk00", 10.0, 20.0)]
    hyp = [SpeakerTurn("rec", "spk01", 0.0, 10.0), SpeakerTurn("rec", "spk00", 10.0, 20.0)]
    c = diarization_error_rate(ref, hyp, None, 0.0).components
    assert (c.total_s, c.false_alarm_s, c.missed_s, c.confusion_s) == (15.0, 5.0, 0.0, 0.0)


TICKS_PER_S = 100  # the exact scorer's grid: every time below is a whole number of ticks


def tick_der(
    ref: list[tuple[str, int, int]],
    hyp: list[tuple[str, int, int]],
    uem: list[tuple[int, int]] | None,
    collar: int,
    skip_overlap: bool,
) -> tuple[float, float, float, float]:
    """(total, missed, false alarm, confusion) in seconds, written from the definitions on a
    grid of ticks (exact when every time is a whole tick): a speaker is on in a tick if any
    of its turns covers it; the mapping is the best of every injective one."""
    size = max(t for _, s, e in ref + hyp for t in (s, e)) + collar + 1
    scored = np.zeros(size, bool)
    for start, end in uem if uem is not None else [(min(s for _, s, _ in ref + hyp), size)]:
        scored[start:end] = True
    if uem is None:
        scored[max(e for _, _, e in ref + hyp) :] = False
    for _, start, end in ref:
        for bound in (start, end) if end > start else ():
            scored[max(0, bound - collar) : bound + collar] = False

    def on(turns: list[tuple[str, int, int]]) -> np.ndarray:
        names = sorted({t[0] for t in turns})
        mask = np.zeros((len(names), size), bool)  # [speaker, tick]
        for name, start, end in turns:
            mask[names.index(name), start:end] = True
        return mask

    r_on, h_on = on(ref), on(hyp)
    if skip_overlap:
        scored &= r_on.sum(axis=0) < 2
    r_on, h_on = r_on & scored, h_on & scored
    n_ref, n_hyp = r_on.sum(axis=0), h_on.sum(axis=0)
    correct = max(
        sum(int((r_on[i] & h_on[j]).sum()) for i, j in enumerate(perm) if j < len(h_on))
        for perm in itertools.permutations(range(max(len(r_on), len(h_on))), len(r_on))
    )
    missed, false_alarm = np.maximum(0, n_ref - n_hyp).sum(), np.maximum(0, n_hyp - n_ref).sum()
    confusion = np.minimum(n_ref, n_hyp).sum() - correct
    return tuple(float(x) / TICKS_PER_S for x in (n_ref.sum(), missed, false_alarm, confusion))  # type: ignore[return-value]


def _tick_turns(rng: random.Random, prefix: str) -> list[tuple[str, int, int]]:
    """Random turns that overlap within a speaker, touch, and are sometimes empty."""
    turns = []
    for k in range(rng.randint(1, 3)):
        for _ in range(rng.randint(1, 4)):
            start = rng.randint(0, 900)
            turns.append((f"{prefix}{k}", start, start + rng.choice([0, *range(1, 300, 7)])))
    name, _, end = turns[0]
    turns.append((name, end, end + rng.randint(1, 100)))  # touches the first
    return turns


@pytest.mark.parametrize("seed", range(6))
def test_matches_an_exact_grid_scorer_with_self_overlap_empty_turns_and_no_uem(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(15):
        ref, hyp = _tick_turns(rng, "r"), _tick_turns(rng, "h")
        uem = rng.choice([None, [(rng.randint(0, 200), 600), (650, rng.randint(700, 1100))]])
        collar, skip = rng.choice([0, 25, 50]), rng.random() < 0.4
        s = float(TICKS_PER_S)
        result = diarization_error_rate(
            [SpeakerTurn("m", n, a / s, b / s) for n, a, b in ref],
            [SpeakerTurn("m", n, a / s, b / s) for n, a, b in hyp],
            None if uem is None else [UemRegion("m", a / s, b / s) for a, b in uem],
            collar / s,
            skip,
        ).components
        got = (result.total_s, result.missed_s, result.false_alarm_s, result.confusion_s)
        assert got == pytest.approx(tick_der(ref, hyp, uem, collar, skip), abs=1e-9)


def test_time_outside_the_uem_is_ignored() -> None:
    ref = [SpeakerTurn("s", "A", 0.0, 10.0)]
    hyp = [SpeakerTurn("s", "X", 0.0, 5.0), SpeakerTurn("s", "Y", 5.0, 10.0)]
    result = diarization_error_rate(ref, hyp, [UemRegion("s", 0.0, 5.0)], 0.0)
    assert result.der == 0.0 and result.components.total_s == pytest.approx(5.0)


@pytest.mark.parametrize("collar_s", [-0.1, math.nan, math.inf, -math.inf])
def test_a_collar_the_cli_refuses_is_a_value_error(collar_s: float) -> None:
    """The CLI refused --collar nan/inf/-1, the API took NaN (scored as no collar) and raised
    from the mapping for infinity (a CLI trial)."""
    ref = [SpeakerTurn("s", "A", 0.0, 1.0)]
    with pytest.raises(ValueError, match="collar_s must be a finite number >= 0"):
        diarization_error_rate(ref, ref, None, collar_s)


@pytest.mark.parametrize(
    ("start_s", "end_s"),
    [(math.nan, 1.0), (0.0, math.nan), (0.0, math.inf), (-1.0, 1.0), (2.0, 1.0)],
)
def test_records_made_in_code_need_the_times_the_readers_need(start_s: float, end_s: float) -> None:
    """The readers refuse NaN, infinite and reversed times; records made in code took them,
    and a NaN turn or segment scored as whatever its sort put it (DER, WER: all of them)."""
    for make in (
        lambda: SpeakerTurn("s", "A", start_s, end_s),
        lambda: TextSegment("s", "A", start_s, end_s, "x"),
        lambda: UemRegion("s", start_s, end_s),
    ):
        with pytest.raises(ValueError, match="needs finite 0 <= start_s <= end_s"):
            make()


def test_errors() -> None:
    ref = [SpeakerTurn("s", "A", 0.0, 1.0)]
    with pytest.raises(InvalidRequest, match="'s' of the reference has no UEM region"):
        diarization_error_rate(ref, ref, [UemRegion("other", 0, 1)], 0.0)
