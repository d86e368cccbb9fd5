"""Speech ends (livemeet/session/vad.py) and the early hops they make due (LiveSession)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

from livemeet.audio.constants import SAMPLE_RATE, SILERO_WINDOW_SAMPLES
from livemeet.errors import ConfigError
from livemeet.session import vad
from livemeet.session.live import LiveOptions, LiveSession
from livemeet.session.vad import (
    FRAME_SAMPLES,
    Endpointer,
    LiveVad,
    PcmFrames,
    SileroClassifier,
    live_classifier,
    webrtc_classifier,
)
from livemeet.transcriber import SegmentPartial
from livemeet.transcript.segments import Segment
from loadtest import workloads as wl
from loadtest.vad_study import Recorder


def is_loud(frame: bytes) -> bool:
    """A stand-in classifier: speech where the frame is loud."""
    return bool(np.abs(np.frombuffer(frame, np.int16)).mean() > 1000)


loud = PcmFrames(is_loud)  # stateless: one for all endpointers


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
    ep = Endpointer(PcmFrames(webrtc_classifier()))
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


class Loud512:
    """A stand-in classifier of Silero's window length: speech where the window is loud."""

    frame_samples = SILERO_WINDOW_SAMPLES

    def classify(self, frames: np.ndarray) -> np.ndarray:
        loud: np.ndarray = np.abs(frames).mean(axis=1) > 0.03
        return loud


def ami(shared_data: Path, name: str) -> np.ndarray:
    audio, rate = sf.read(shared_data / "ami-pyannote-debug" / f"{name}.wav", dtype="float32")
    assert rate == SAMPLE_RATE
    return np.asarray(audio)


def windows(audio: np.ndarray) -> np.ndarray:
    """[n] -> [n // 512, 512]: the whole Silero windows of `audio`."""
    num = audio.size // SILERO_WINDOW_SAMPLES
    return audio[: num * SILERO_WINDOW_SAMPLES].reshape(num, -1)


def ends_of(ep: Endpointer, audio: np.ndarray, chunk: int) -> list[int]:
    ends: list[int] = []
    for i in range(0, audio.size, chunk):
        ep.feed(audio[i : i + chunk])
        if ep.last_end is not None and ep.num_ends > len(ends):
            ends.append(ep.last_end)
    return ends


def test_the_endpointer_counts_in_the_classifiers_own_frames() -> None:
    """With 512-sample frames (Silero's 32 ms) an end is where the last speech frame ends, in
    samples; an end's silence is 0.15 s rounded up to 5 frames (160 ms), not 30-ms ones."""
    ep = Endpointer(Loud512(), end_silence_s=0.15, min_speech_s=0.09)
    assert (ep.end_frames, ep.min_speech_frames) == (5, 3)
    assert ep.end_silence_samples == 5 * SILERO_WINDOW_SAMPLES
    ep.feed(tone(0.6))  # 9,600 samples: 18 whole frames and 384 samples of the 19th
    ep.feed(silence(0.008))  # the 19th frame complete: 384 of its 512 samples are tone
    ep.feed(silence(4 * SILERO_WINDOW_SAMPLES / SAMPLE_RATE))
    assert ep.last_end is None  # 4 silent frames: not yet an end
    ep.feed(silence(SILERO_WINDOW_SAMPLES / SAMPLE_RATE))
    assert ep.last_end == ep.last_speech_end == 19 * SILERO_WINDOW_SAMPLES
    assert ep.num_samples == 24 * SILERO_WINDOW_SAMPLES


def test_silero_hears_real_speech_and_not_the_silence_before_a_turn(shared_data: Path) -> None:
    """AMI dev01 before its first turn (0-4.2 s; the RTTM's first starts at 4.3 s) holds no
    speech window; its MEE009 turn (7.0-11.7 s) and a LibriSpeech utterance are mostly
    speech."""
    pytest.importorskip("faster_whisper")
    dev01 = ami(shared_data, "dev01")
    assert not SileroClassifier().classify(windows(dev01[: round(4.2 * SAMPLE_RATE)])).any()
    turn = dev01[7 * SAMPLE_RATE : round(11.7 * SAMPLE_RATE)]
    assert SileroClassifier().classify(windows(turn)).mean() > 0.7
    book, rate = sf.read(
        shared_data / "librispeech-lhotse" / "2412-153948-0000.flac", dtype="float32"
    )
    assert rate == SAMPLE_RATE
    assert SileroClassifier().classify(windows(book)).mean() > 0.7


@pytest.mark.parametrize("batch", [1, 3, 7, 64])
def test_silero_streamed_in_batches_is_faster_whisper_over_the_whole_clip(
    shared_data: Path, batch: int
) -> None:
    """Each window is read after the previous one's context and continues its LSTM state, so
    a stream classified `batch` windows at a time gets faster-whisper's probabilities of the
    whole clip (its `get_vad_model()(audio)`), but for the last window: faster-whisper hears
    that one with its last 64 samples zeroed, written into the array it is given (a view of
    `frames` once zeroed both, and so matched only by that side effect)."""
    fw_vad = pytest.importorskip("faster_whisper.vad")
    frames = windows(ami(shared_data, "dev00")[: 10 * SAMPLE_RATE])
    whole = np.asarray(fw_vad.get_vad_model()(frames.copy().reshape(-1))).reshape(-1)
    silero = SileroClassifier()
    streamed = [silero.probabilities(frames[i : i + batch]) for i in range(0, len(frames), batch)]
    np.testing.assert_allclose(np.concatenate(streamed)[:-1], whole[:-1], atol=1e-6)


def test_sessions_never_share_silero_state(shared_data: Path) -> None:
    """Two sessions' classifiers fed in turns get each what it gets alone; the state they
    keep is real (a classifier that heard one session's speech judges the other's audio
    otherwise), so sharing one would show."""
    pytest.importorskip("faster_whisper")
    a = windows(ami(shared_data, "dev00")[: 6 * SAMPLE_RATE])
    b = windows(ami(shared_data, "tst00")[: 6 * SAMPLE_RATE])
    alone_a = SileroClassifier().probabilities(a)
    alone_b = SileroClassifier().probabilities(b)
    first, second = SileroClassifier(), SileroClassifier()
    got_a, got_b = [], []
    for i in range(0, len(a), 3):  # 96-ms batches, as 100-ms chunks make them
        got_a.append(first.probabilities(a[i : i + 3]))
        got_b.append(second.probabilities(b[i : i + 3]))
    np.testing.assert_array_equal(np.concatenate(got_a), alone_a)
    np.testing.assert_array_equal(np.concatenate(got_b), alone_b)
    shared = SileroClassifier()
    shared.probabilities(a)
    assert np.abs(shared.probabilities(b) - alone_b).max() > 0.05


@pytest.mark.parametrize("chunk", [1600, 333, 512, 4000])  # at most one end per chunk
def test_silero_ends_in_samples_agree_with_its_windows(shared_data: Path, chunk: int) -> None:
    """Real speech through an Endpointer on Silero: every end is a window edge, the window
    before it is speech and the end's 5 windows after it are not; chunking moves no end."""
    pytest.importorskip("faster_whisper")
    audio = ami(shared_data, "dev01")
    recorder = Recorder(SileroClassifier())
    ep = Endpointer(recorder)
    ends = ends_of(ep, audio, chunk)
    frames = np.concatenate(recorder.decisions)
    assert len(frames) == audio.size // SILERO_WINDOW_SAMPLES
    assert len(ends) >= 3  # dev01 has pauses of seconds between its turns
    for end in ends:
        k, rest = divmod(end, SILERO_WINDOW_SAMPLES)
        assert rest == 0 and frames[k - 1] and not frames[k : k + ep.end_frames].any()
    assert ends == ends_of(Endpointer(SileroClassifier()), audio, 1600)


def test_silero_speech_holds_until_the_probability_falls_below_the_end_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Silero's hysteresis: speech from a window at the threshold until one below it by
    `hysteresis`; between the two a window is as the one before."""
    monkeypatch.setattr(vad, "silero_model", lambda: None)
    silero = SileroClassifier(threshold=0.5, hysteresis=0.15)
    probs = np.array([0.4, 0.5, 0.4, 0.36, 0.34, 0.45, 0.49, 0.9], np.float32)
    monkeypatch.setattr(silero, "probabilities", lambda frames: probs)
    got = silero.classify(np.zeros((len(probs), SILERO_WINDOW_SAMPLES), np.float32))
    assert got.tolist() == [False, True, True, True, False, False, False, True]


@pytest.mark.parametrize("missing", ["faster_whisper", "onnxruntime"])
def test_silero_without_the_demo_extra_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    """Not an ImportError trace: a ConfigError naming the extra and the other VAD."""
    for name in (missing, f"{missing}.vad"):
        monkeypatch.setitem(sys.modules, name, None)  # the import fails
    with pytest.raises(ConfigError, match=r"pip install 'livemeet\[demo\]'.*--live-vad webrtc"):
        live_classifier(LiveVad.SILERO)
    assert isinstance(live_classifier(LiveVad.WEBRTC), PcmFrames)  # WebRTC needs no extra
    with pytest.raises(ValueError, match="threshold"):
        SileroClassifier(threshold=1.0)


def test_a_silero_model_of_another_shape_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another faster-whisper's model (Silero v5 took `state` and `sr`) is refused by name,
    not run with the wrong inputs."""
    fw_vad = pytest.importorskip("faster_whisper.vad")
    inputs = [SimpleNamespace(name="input", shape=[None, 512]),
              SimpleNamespace(name="state", shape=[2, 1, 128]),
              SimpleNamespace(name="sr", shape=[])]  # fmt: skip
    model = SimpleNamespace(session=SimpleNamespace(get_inputs=lambda: inputs))
    monkeypatch.setattr(fw_vad, "get_vad_model", lambda: model)
    with pytest.raises(ConfigError, match="silero_vad_v6"):
        SileroClassifier()


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
