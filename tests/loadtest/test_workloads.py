"""Synthetic workloads: exact forced-transcript lengths, parseable segments, non-silent audio."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.models.tokenizer import load_tokenizer
from livemeet.transcript.parser import parse_transcript
from loadtest import workloads as wl


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


def test_workload_sizes_follow_design_section_10() -> None:
    assert wl.WORKLOADS["long"].num_output_tokens == 12_320  # 330 x 2240 / 60
    assert wl.WORKLOADS["short"] == wl.Workload("short", 11.6, 64)
    assert wl.get_workload("long", 60.0).num_output_tokens == 330
    with pytest.raises(KeyError):
        wl.get_workload("medium")


@pytest.mark.parametrize("name", ["short", "long"])
def test_forced_transcript_is_exact_and_parses(tokenizer, name: str) -> None:
    workload = wl.WORKLOADS[name]
    samples, forced = wl.make_forced(tokenizer, workload, seed=7)
    assert len(forced.token_ids) == workload.num_output_tokens - 1  # + EOS = N
    assert list(forced.token_ids) == tokenizer.encode(forced.text, add_special_tokens=False).ids
    segments = parse_transcript(forced.text)
    assert len(segments) == len(forced.turns)
    speakers = {s.speaker for s in segments}
    assert 2 <= len(speakers) <= 4 or len(segments) < 3
    assert all(s.text for s in segments)
    assert segments[-1].end_s <= workload.audio_s + 1e-6
    assert len(samples) == round(workload.audio_s * SAMPLE_RATE)
    assert samples.dtype == np.float32 and np.abs(samples).max() <= 1.0


def test_turns_are_clause_sized_and_alternate() -> None:
    turns = wl.plan_turns(600.0, seed=3)
    lengths = [t.end_s - t.start_s for t in turns[:-1]]
    assert min(lengths) >= wl.TURN_MIN_S - 0.01 and max(lengths) <= wl.TURN_MAX_S + 0.01
    assert all(a.speaker != b.speaker for a, b in zip(turns, turns[1:], strict=False))
    assert all(b.start_s >= a.end_s for a, b in zip(turns, turns[1:], strict=False))
    with pytest.raises(ValueError):
        wl.plan_turns(0.0, seed=0)


def test_audio_is_voiced_in_turns_and_quiet_between() -> None:
    turns = [wl.Turn(0, 1.0, 4.0), wl.Turn(1, 6.0, 9.0)]
    audio = wl.synthetic_audio(10.0, seed=1, turns=turns)

    def rms(a: float, b: float) -> float:
        window = audio[int(a * SAMPLE_RATE) : int(b * SAMPLE_RATE)]
        return float(np.sqrt(np.mean(window**2)))

    assert rms(1.5, 3.5) > 5 * rms(4.2, 5.8)
    assert rms(4.2, 5.8) == pytest.approx(wl.NOISE_RMS, rel=0.2)


def test_vary_changes_every_window_and_wav_round_trips() -> None:
    audio = wl.synthetic_audio(31.0, seed=2)
    other = wl.vary(audio, 1)
    assert wl.vary(audio, 0) is audio
    assert not np.array_equal(audio[: 30 * SAMPLE_RATE], other[: 30 * SAMPLE_RATE])
    with wave.open(io.BytesIO(wl.wav_bytes(audio))) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (SAMPLE_RATE, 1, 2)
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    np.testing.assert_allclose(pcm / 32767.0, audio, atol=1e-4)


def test_impossible_length_raises(tokenizer) -> None:
    turns = wl.plan_turns(30.0, seed=0)
    with pytest.raises(ValueError):
        wl.forced_transcript(tokenizer, turns, num_output_tokens=5)
    merged = wl.forced_transcript(tokenizer, turns, num_output_tokens=40)
    assert len(merged.turns) < len(turns) and len(merged.token_ids) == 39
