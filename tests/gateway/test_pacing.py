"""The live ingest pacer (livemeet/gateway/pacing.py): a burst ahead of real time is free,
then audio is read no faster than max speed; tiny messages count at their minimum."""

from __future__ import annotations

import math

import pytest

from livemeet.gateway.pacing import AudioPacer


def test_a_burst_is_free_then_reading_follows_max_speed() -> None:
    pacer = AudioPacer(start_s=100.0, max_speed=4.0, burst_s=10.0)
    assert pacer.charge(10.0, 100.0) == 0.0  # the whole burst at once
    assert pacer.charge(2.0, 100.0) == pytest.approx(0.5)  # 2 s over: 2 / 4 s
    # once the wait has passed, the same 12 s are within 10 + 4 x 0.5
    assert pacer.charge(0.0, 100.5) == pytest.approx(0.01 / 4.0)  # the text minimum only


def test_real_time_streams_never_wait() -> None:
    pacer = AudioPacer(start_s=0.0, max_speed=1.0, burst_s=0.2)  # a frame, and slack
    waits = [pacer.charge(0.1, 0.1 * (i + 1)) for i in range(600)]  # 60 s in 0.1-s frames
    assert max(waits) == 0.0


def test_a_flood_of_tiny_frames_is_paced_by_the_message_minimum() -> None:
    """917k 2-byte frames in 15 s stalled the gateway (a trial): each counts as 10 ms."""
    pacer = AudioPacer(start_s=0.0, max_speed=16.0, burst_s=60.0, min_message_s=0.01)
    wait = 0.0
    for _ in range(100_000):
        wait = pacer.charge(1 / 16_000, 0.0)  # one sample each, all at once
    assert wait == pytest.approx((100_000 * 0.01 - 60.0) / 16.0)


def test_waiting_first_buys_no_larger_flood() -> None:
    """The credit grew without bound: after 7 idle minutes 1.8 h went through at once, and
    after an hour streamed in real time, 14 h (a review). The bucket holds one burst."""
    idle = AudioPacer(start_s=0.0, max_speed=16.0, burst_s=60.0)
    assert idle.charge(0.0, 420.0) == pytest.approx(0.0)  # a keepalive after 7 minutes
    assert idle.charge(6_480.0, 420.0) == pytest.approx((6_480.0 + 0.01 - 60.0) / 16.0)
    streamed = AudioPacer(start_s=0.0, max_speed=16.0, burst_s=60.0)
    for i in range(36_000):  # an hour in 0.1-s frames, in real time
        assert streamed.charge(0.1, 0.1 * (i + 1)) == 0.0
    assert streamed.charge(14 * 3_600.0, 3_600.0) > 3_000.0


@pytest.mark.parametrize(
    "bad", [{"max_speed": 0.0}, {"max_speed": math.nan}, {"max_speed": math.inf}, {"burst_s": -1}]
)
def test_bad_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AudioPacer(start_s=0.0, **bad)
