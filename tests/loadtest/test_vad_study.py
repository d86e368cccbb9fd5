"""loadtest.vad_study: the live VADs against the AMI RTTM, and their CPU cost."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.eval.io import SpeakerTurn
from loadtest import vad_study as vs
from tests.loadtest.conftest import run_module


def turn(start_s: float, end_s: float, speaker: str = "A") -> SpeakerTurn:
    return SpeakerTurn("x", speaker, start_s, end_s)


def test_pause_ends_merge_speakers_and_skip_short_pauses() -> None:
    """An end counts where nobody talks for at least the pause after it: overlapping turns
    of two speakers are one stretch, a 0.1-s gap is no pause, one reaching the end is."""
    turns = [turn(0.0, 1.0), turn(0.8, 2.0, "B"), turn(2.1, 3.0), turn(3.5, 4.8)]
    mask = vs.speech_mask(turns, 5 * SAMPLE_RATE)
    assert mask.sum() == round(4.2 * SAMPLE_RATE)
    assert vs.pause_ends(mask, 0.15) == [3 * SAMPLE_RATE, round(4.8 * SAMPLE_RATE)]
    assert vs.pause_ends(mask, 0.25) == [3 * SAMPLE_RATE]  # 0.2 s before the end: too short


def test_ends_are_found_once_each_and_inside_speech_is_counted() -> None:
    """Each reference end takes the nearest Endpointer end within MATCH_S that no other has
    taken; an end whose following end-silence the reference fills is inside speech."""
    ref = vs.speech_mask([turn(0.0, 1.0), turn(2.0, 4.0)], 5 * SAMPLE_RATE)
    at = [round(s * SAMPLE_RATE) for s in (0.9, 1.05, 3.0, 4.3)]
    ends = [(e, e + 4000) for e in at]  # each reported 0.25 s after it
    counts = vs.Counts()
    waits = vs._score_ends(counts, ends, ref)
    assert (counts.targets, counts.found, counts.ends, counts.inside) == (2, 1, 4, 1)
    assert waits == [round(1.05 * SAMPLE_RATE) + 4000 - SAMPLE_RATE]  # 1.05 is nearer 1.0


def test_frame_scores() -> None:
    ref = np.array([True] * 6 + [False] * 4)
    hyp = np.array([True] * 3 + [False] * 5 + [True] * 2)
    counts = vs.Counts()
    vs._score_frames(counts, hyp, ref)
    result = vs.Result((50.0,), counts, 0.0, 0.0)
    assert (result.miss, result.false_alarm) == (0.5, 0.5)
    assert result.f1 == pytest.approx(2 * 3 / (6 + 5))


def test_the_study_prints_a_row_per_setting_on_a_short_excerpt(shared_data: Path) -> None:
    pytest.importorskip("faster_whisper")
    out = run_module(
        "loadtest.vad_study", "--data", str(shared_data), "--seconds", "6", "--repeats", "1"
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| webrtc") or "| silero" in line]
    assert len(rows) == len(vs.WEBRTC_MODES) + len(vs.SILERO_THRESHOLDS)
    assert "| webrtc | mode 2 |" in out and "| silero | threshold 0.5 |" in out
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 13
        assert 0.0 <= float(cells[5]) <= 1.0  # F1
        assert float(cells[11]) > 0.0  # CPU ms per audio second
