"""Speech ends (livemeet/session/vad.py) and the early hops they make due (LiveSession)."""

from __future__ import annotations

import numpy as np
import pytest

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.session.live import LiveOptions, LiveSession
from livemeet.session.vad import FRAME_SAMPLES, Endpointer, webrtc_classifier
from livemeet.transcriber import SegmentPartial
from livemeet.transcript.segments import Segment
from loadtest import workloads as wl


def loud(frame: bytes) -> bool:
    """A stand-in classifier: speech where the frame is loud."""
    return bool(np.abs(np.frombuffer(frame, np.int16)).mean() > 1000)


def tone(seconds: float) -> np.ndarray:
    t = np.arange(round(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE), np.float32)


def feed_in_chunks(ep: Endpointer, audio: np.ndarray, chunk: int) -> None:
    for i in range(0, audio.size, chunk):
        ep.feed(audio[i : i + chunk])


def test_an_end_is_where_speech_stopped_once_enough_silence_follows() -> None:
    ep = Endpointer(loud, end_silence_s=0.15, min_speech_s=0.09)
    ep.feed(tone(0.6))
    ep.feed(silence(0.12))  # 4 frames of silence: not yet an end
    assert ep.last_end is None
    ep.feed(silence(0.06))
    assert ep.last_end == 20 * FRAME_SAMPLES  # 0.6 s of speech: 20 frames
    assert ep.num_ends == 1
    ep.feed(silence(2.0))  # more silence: still one end
    assert ep.num_ends == 1 and ep.num_samples == round(2.78 * SAMPLE_RATE)


@pytest.mark.parametrize("chunk", [1, 160, 479, 480, 1600, 7777])
def test_chunking_does_not_move_the_ends(chunk: int) -> None:
    audio = np.concatenate([tone(0.5), silence(0.3), tone(1.0), silence(0.1), tone(0.4),
                            silence(0.5)])  # fmt: skip
    whole = Endpointer(loud)
    whole.feed(audio)
    parts = Endpointer(loud)
    feed_in_chunks(parts, audio, chunk)
    # the 0.1-s pause is no end; the last speech frame is the one holding 2.3 s
    last_frame_end = -(-round(2.3 * SAMPLE_RATE) // FRAME_SAMPLES) * FRAME_SAMPLES
    assert (parts.last_end, parts.num_ends) == (whole.last_end, whole.num_ends)
    assert (whole.last_end, whole.num_ends) == (last_frame_end, 2)


def test_blips_are_not_heard_as_speech() -> None:
    """Clicks of one or two frames, apart by end-length silences, move neither the ends nor
    the last speech heard; a run of min_speech_s does, from its last frame."""
    ep = Endpointer(loud, end_silence_s=0.15, min_speech_s=0.09)
    # every length a whole number of 30-ms frames, so each click fills its frames
    ep.feed(np.concatenate([tone(0.03), silence(0.51), tone(0.06), silence(0.51)]))
    assert ep.last_speech_end == 0 and ep.last_end is None
    ep.feed(np.concatenate([tone(0.03), silence(0.06), tone(0.06)]))  # a short pause joins them
    assert ep.last_speech_end == ep.num_samples  # three speech frames: heard, up to here


def test_short_pauses_and_blips_are_not_ends() -> None:
    ep = Endpointer(loud, end_silence_s=0.15, min_speech_s=0.09)
    ep.feed(np.concatenate([tone(1.0), silence(0.09), tone(1.0)]))  # a pause inside a turn
    assert ep.last_end is None
    ep.feed(silence(0.3))
    assert ep.num_ends == 1
    ep.feed(np.concatenate([tone(0.03), silence(0.5), tone(0.03), silence(0.5)]))  # clicks
    assert ep.num_ends == 1  # blips of 1-2 frames apart by a silence never add up to speech


def test_bad_settings() -> None:
    with pytest.raises(ValueError):
        Endpointer(loud, end_silence_s=0.0)
    with pytest.raises(ValueError):
        webrtc_classifier(4)


def test_webrtc_finds_turn_ends_of_the_benchmark_meeting_and_nothing_inside_turns() -> None:
    """WebRTC's VAD (mode 2) on the synthetic meeting of the live benchmark: an end near most
    turn ends followed by a pause of 0.2 s or more, and none inside a turn."""
    turns = wl.plan_turns(120.0, seed=1)
    audio = wl.synthetic_audio(120.0, 1, turns)
    ep = Endpointer(webrtc_classifier())
    ends: list[int] = []
    for i in range(0, audio.size, SAMPLE_RATE // 10):  # 100-ms frames, as clients send
        ep.feed(audio[i : i + SAMPLE_RATE // 10])
        if ep.last_end is not None and (not ends or ends[-1] != ep.last_end):
            ends.append(ep.last_end)
    end_s = [e / SAMPLE_RATE for e in ends]
    near = [any(abs(e - t.end_s) <= 0.1 for t in turns) for e in end_s]
    assert all(near), [e for e, ok in zip(end_s, near, strict=True) if not ok]
    paused = [a for a, b in zip(turns, turns[1:], strict=False) if b.start_s - a.end_s >= 0.2]
    found = sum(any(abs(e - t.end_s) <= 0.1 for e in end_s) for t in paused)
    assert found >= 0.8 * len(paused) > 0


def test_a_speech_end_makes_the_hop_due_at_once() -> None:
    live = LiveSession(LiveOptions(hop_s=1.0), Endpointer(loud))
    live.receive_audio(tone(0.5))
    assert not live.hop_due()
    live.receive_audio(silence(0.12))
    assert not live.hop_due()  # not an end yet
    live.receive_audio(silence(0.06))
    assert live.speech_end_due() and live.hop_due()  # 0.68 s of audio, no whole hop
    window = live.window()
    assert window.end_s == pytest.approx(0.68)
    live.apply_hypothesis([])
    assert not live.speech_end_due() and not live.hop_due()  # decoded past the end
    live.receive_audio(tone(1.0))
    assert live.hop_due() and not live.speech_end_due()  # a whole hop of speech, as without VAD


def test_hops_in_silence_are_skipped_up_to_a_bound() -> None:
    """A hop of audio without speech is not decoded while nothing waits to be committed; after
    LIVE_SILENCE_HOP_S of it a hop runs anyway (speech the VAD missed is decoded that late at
    most); speech makes hops due again."""
    live = LiveSession(LiveOptions(hop_s=1.0), Endpointer(loud))
    live.receive_audio(silence(1.0))
    assert live.silence_skipped() and not live.hop_due()  # a session opened in silence
    live.receive_audio(silence(3.9))
    assert not live.hop_due()
    live.receive_audio(silence(0.1))
    assert live.hop_due() and not live.silence_skipped()  # 5 s of it: decoded anyway
    live.window()
    live.apply_hypothesis([])
    live.receive_audio(np.concatenate([silence(0.5), tone(0.6)]))
    assert not live.silence_skipped() and live.hop_due()  # speech in the new audio


def test_silence_is_decoded_while_a_segment_waits_to_be_committed() -> None:
    """After speech the open tail needs hops to commit (two agreeing hypotheses): they run
    through the silence that follows; once the tail is committed, silence is skipped."""
    live = LiveSession(LiveOptions(hop_s=1.0), Endpointer(loud))
    live.receive_audio(np.concatenate([tone(0.8), silence(0.2)]))
    assert live.hop_due()  # the speech end
    live.window()
    seg = Segment(0.0, 0.8, "S01", "hello there")
    events = live.apply_hypothesis([seg])
    assert any(isinstance(e, SegmentPartial) for e in events)  # an open tail
    skipped = []
    for _ in range(4):
        live.receive_audio(silence(1.0))
        skipped.append(live.silence_skipped())
        if live.hop_due():
            live.window()
            live.apply_hypothesis([seg])
    # the tail waits for its commit: decoded; committed by that hop, the rest is skipped
    assert skipped == [False, True, True, True]
    assert [s.text for s in live.committed] == ["hello there"]


def test_an_end_heard_while_a_hop_decodes_is_due_after_it() -> None:
    live = LiveSession(LiveOptions(hop_s=1.0), Endpointer(loud))
    live.receive_audio(tone(1.0))
    live.window()  # a hop of 1 s in flight
    live.receive_audio(tone(0.3))
    live.receive_audio(silence(0.2))  # speech ended at 1.3 s, after the hop's edge
    live.apply_hypothesis([])
    assert live.speech_end_due() and live.hop_due()


def test_without_an_endpointer_hops_wait_for_a_whole_hop() -> None:
    live = LiveSession(LiveOptions(hop_s=1.0))
    live.receive_audio(np.concatenate([tone(0.5), silence(0.3)]))
    assert not live.speech_end_due() and not live.hop_due()


def test_speech_just_before_a_hops_edge_is_decoded_again() -> None:
    """Speech that stopped less than an end's silence before the last hop's edge (a word the
    hop may have cut) keeps the next hop from being skipped."""
    live = LiveSession(LiveOptions(hop_s=1.0), Endpointer(loud))
    live.receive_audio(np.concatenate([silence(0.88), tone(0.12)]))  # speech up to the edge
    assert live.hop_due()
    live.window()
    live.apply_hypothesis([])  # nothing decoded: the word was cut
    live.receive_audio(silence(1.0))
    assert not live.silence_skipped() and live.hop_due()


def test_blips_in_a_noisy_room_do_not_keep_silence_hops_running() -> None:
    """Once the tail is committed, hops over audio holding only clicks (a frame or two at a
    time) are skipped as silence; a word among them makes the next hop due."""
    live = LiveSession(LiveOptions(hop_s=1.0), Endpointer(loud))
    live.receive_audio(np.concatenate([tone(0.81), silence(0.21)]))  # whole 30-ms frames
    live.window()
    live.apply_hypothesis([])  # nothing to commit
    clicks = np.concatenate([silence(0.3), tone(0.03), silence(0.42), tone(0.03), silence(0.24)])
    for _ in range(3):
        live.receive_audio(clicks)
        assert live.silence_skipped() and not live.hop_due()
    live.receive_audio(np.concatenate([tone(0.3), silence(0.72)]))
    assert live.hop_due() and not live.silence_skipped()


def test_skipping_never_lets_the_open_window_pass_its_limit() -> None:
    """The hop whose forced commit keeps the open window within max_window_s is not skipped,
    silence or not."""
    options = LiveOptions(hop_s=1.0, max_window_s=6.0)
    live = LiveSession(options, Endpointer(loud))
    live.receive_audio(np.concatenate([tone(1.0), silence(0.5)]))
    live.window()
    live.apply_hypothesis([])
    live.receive_audio(silence(3.5))  # a 5-s window: one more hop reaches 6 s, not past it
    assert live.silence_skipped() and not live.hop_due()
    live.receive_audio(silence(0.1))  # 5.1 s: one more hop would pass the limit
    assert live.hop_due() and not live.silence_skipped()
