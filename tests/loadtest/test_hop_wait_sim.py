"""loadtest.hop_wait_sim: the wait from a turn's end to the first hop that covers it."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest import hop_wait_sim as sim
from loadtest import workloads as wl


@pytest.fixture(scope="module")
def meeting() -> tuple[np.ndarray, list[wl.Turn]]:
    turns = wl.plan_turns(60.0, 0)
    return wl.synthetic_audio(60.0, 0, turns), turns


def test_waits_are_bounded_by_a_hop_and_the_frame(
    meeting: tuple[np.ndarray, list[wl.Turn]],
) -> None:
    audio, turns = meeting
    r = sim.simulate(audio, turns, hop_time_s=0.0, vad=False)
    assert r.early_hops == 0 and r.hops == 60  # one per second of audio
    assert r.waits_s and min(r.waits_s) >= 0.0
    assert max(r.waits_s) <= 1.0 + sim.FRAME_S + 1e-9


def test_speech_ends_move_hops_earlier_when_hops_are_short(
    meeting: tuple[np.ndarray, list[wl.Turn]],
) -> None:
    audio, turns = meeting
    plain = sim.simulate(audio, turns, hop_time_s=0.3, vad=False)
    voiced = sim.simulate(audio, turns, hop_time_s=0.3, vad=True)
    assert voiced.early_hops > 0
    assert np.mean(voiced.waits_s) < np.mean(plain.waits_s)


def test_a_negative_hop_time_is_refused(meeting: tuple[np.ndarray, list[wl.Turn]]) -> None:
    audio, turns = meeting
    with pytest.raises(ValueError, match="hop_time_s"):
        sim.simulate(audio, turns, hop_time_s=-1.0, vad=False)
