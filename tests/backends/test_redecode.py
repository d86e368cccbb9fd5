"""RedecodeCore through the scripted backend: uploads, errors, scheduling."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.backends.scripted import Script, ScriptedCore
from livemeet.backends.segment_stream import UploadTranscript
from livemeet.errors import InvalidRequest, NotFound, ProtocolError
from livemeet.transcriber import (
    Error,
    LiveRestore,
    SegmentFinal,
    SessionOptions,
    TextDelta,
    TranscriptFinal,
)
from livemeet.transcript.segments import Segment, SegmentFlag, Transcript
from tests.backends.helpers import run_to_idle, stream

UPLOAD = SessionOptions(live=False)


def audio(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE), np.float32)


def long_reference(duration_s: float, seg_s: float = 7.0) -> tuple[Segment, ...]:
    out, t, k = [], 0.2, 0
    while t + seg_s < duration_s:
        out.append(Segment(t, t + seg_s, f"S0{k % 3 + 1}", f"sentence number {k} is spoken here"))
        t, k = t + seg_s, k + 1
    return tuple(out)


def upload_finals(
    segments: Sequence[Segment], duration_s: float
) -> tuple[tuple[Segment, ...], list[str]]:
    """An upload's final segments and text deltas, made as sessions make them (UploadTranscript,
    the MOSS backend's too)."""
    transcript = UploadTranscript(duration_s)
    added = [a for a in map(transcript.add, segments) if a is not None]
    return tuple(final for final, _ in added), [delta for _, delta in added if delta]


def text_deltas(segments: Sequence[Segment]) -> list[str]:
    return upload_finals(segments, max((s.end_s for s in segments), default=0.0))[1]


def upload_segments(segments: Sequence[Segment], duration_s: float) -> tuple[Segment, ...]:
    return upload_finals(segments, duration_s)[0]


def test_text_deltas_concatenate_to_transcript_text() -> None:
    segs = [
        Segment(0, 1, "S01", " Hello there. "),
        Segment(1, 2, "S01", "你好"),
        Segment(2, 3, "S02", "世界"),
        Segment(3, 4, "S01", ""),
        Segment(4, 5, "S01", "ok"),
    ]
    deltas = text_deltas(segs)
    assert "".join(deltas) == Transcript(tuple(segs), 5.0).text
    assert deltas[0] == "Hello there." and deltas[2] == "世界"


def test_upload_segments_are_clamped_and_numbered() -> None:
    segs = upload_segments(
        [Segment(2, 3, "S01", "a"), Segment(1, 12, "S01", "b"), Segment(3, 4, "S01", " ")],
        duration_s=10.0,
    )
    assert [(s.id, s.start_s, s.end_s) for s in segs] == [("seg-0001", 2, 3), ("seg-0002", 2, 10)]
    assert all(s.is_final for s in segs)


@pytest.mark.parametrize("duration_s", [5.0, 95.0])
def test_upload_decodes_once_at_end_in_windows(duration_s: float) -> None:
    reference = long_reference(duration_s, seg_s=4.0 if duration_s < 10 else 7.0)
    core = ScriptedCore(Script(reference))
    events = stream(core, audio(duration_s), chunk_s=5.0, options=UPLOAD)
    final = events[-1]
    assert isinstance(final, TranscriptFinal) and final.duration_s == duration_s
    deltas = [e.text for e in events[:-1] if isinstance(e, TextDelta)]
    assert "".join(deltas) == Transcript(final.segments, duration_s).text
    assert [e.segment for e in events if isinstance(e, SegmentFinal)] == list(final.segments)
    assert [s.text for s in final.segments] == [r.text for r in reference]
    # segments cut by a 30 s window boundary were re-decoded whole from the next window
    assert [(s.start_s, s.end_s) for s in final.segments] == [
        (r.start_s, r.end_s) for r in reference
    ]
    assert core.num_hops >= duration_s / 30  # one decode per <= 30 s window


def test_empty_upload() -> None:
    events = stream(ScriptedCore(), audio(0), options=UPLOAD)
    assert len(events) == 1 and isinstance(events[0], TranscriptFinal)
    assert events[0].segments == () and events[0].coverage == 0.0


def test_decode_failure_fails_only_that_session() -> None:
    core = ScriptedCore(Script(long_reference(20.0), fail_hops=frozenset({0})))
    core.open("a", SessionOptions())
    core.open("b", SessionOptions())
    out: list = []
    core.append("a", audio(1.0))
    run_to_idle(core, out)  # hop 0 fails: a gets an Error and is forgotten
    for _ in range(6):
        core.append("b", audio(1.0))
        run_to_idle(core, out)
    core.end("b")
    run_to_idle(core, out)
    a = [e for sid, e in out if sid == "a"]
    assert len(a) == 1 and isinstance(a[0], Error) and a[0].code == "internal_error"
    # the client hears the exception's class; its text, which may name the server's files or
    # devices, is the log's (a security review)
    assert "RuntimeError" in a[0].message and "scripted decode failure" not in a[0].message
    assert isinstance([e for sid, e in out if sid == "b"][-1], TranscriptFinal)
    with pytest.raises(NotFound):
        core.append("a", audio(1.0))
    assert core.num_sessions == 0


def test_round_robin_between_sessions() -> None:
    core = ScriptedCore(Script(long_reference(20.0)))
    for sid in ("a", "b"):
        core.open(sid, SessionOptions())
        core.append(sid, audio(3.0))
    first = {sid for sid, _ in core.step()}
    second = {sid for sid, _ in core.step()}
    assert first | second == {"a", "b"} and first != second


def test_command_errors() -> None:
    core = ScriptedCore()
    with pytest.raises(NotFound):
        core.end("nope")
    core.open("a", UPLOAD)
    with pytest.raises(InvalidRequest):
        core.open("a", UPLOAD)
    with pytest.raises(InvalidRequest):
        core.open("b", SessionOptions(sample_rate=44_100))
    core.end("a")
    with pytest.raises(ProtocolError):
        core.append("a", audio(1.0))
    with pytest.raises(ProtocolError):
        core.end("a")
    core.abort("a")
    assert core.num_sessions == 0 and not core.has_work()


def unchecked_restore(finals: tuple[Segment, ...]) -> LiveRestore:
    """A LiveRestore that skipped its own check, as one unpickled in the engine worker does."""
    restore = object.__new__(LiveRestore)
    object.__setattr__(restore, "finals", finals)
    return restore


def test_restore_errors() -> None:
    """A restore is for live sessions only, and its finals are checked again at open."""
    stored = (Segment(0.0, 1.0, "S01", "a", id="seg-0001", is_final=True),)
    core = ScriptedCore()
    with pytest.raises(InvalidRequest, match="restore is for live sessions"):
        core.open("a", SessionOptions(live=False, restore=LiveRestore(stored)))
    with pytest.raises(ValueError, match="repeats the id"):
        LiveRestore(stored * 2)
    with pytest.raises(InvalidRequest, match="repeats the id"):
        core.open("a", SessionOptions(restore=unchecked_restore(stored * 2)))
    with pytest.raises(InvalidRequest, match="bad live settings"):
        core.open("a", SessionOptions(hop_s=0.0))
    assert core.num_sessions == 0


class PromptRecorder(ScriptedCore):
    def __init__(self, script: Script) -> None:
        super().__init__(script)
        self.prompts: list[str | None] = []

    def transcribe_window(self, samples, offset_s, prompt):  # type: ignore[no-untyped-def]
        self.prompts.append(prompt)
        return super().transcribe_window(samples, offset_s, prompt)


@pytest.mark.parametrize("use_committed", [True, False])
def test_prompt_is_options_then_committed_text(use_committed: bool) -> None:
    reference = long_reference(20.0, seg_s=3.0)
    core = PromptRecorder(Script(reference))
    core.use_committed_prompt = use_committed
    stream(core, audio(12.0), options=SessionOptions(prompt="Agenda:", hotwords=("Ebenezer",)))
    assert core.prompts[0] == "Agenda: Ebenezer"
    with_text = [p for p in core.prompts if p and reference[0].text in p]
    assert bool(with_text) == use_committed
    assert all(p is not None and p.startswith("Agenda: Ebenezer") for p in core.prompts)


@pytest.mark.parametrize("live", [True, False])
def test_a_backend_may_decode_without_the_request_prompt(live: bool) -> None:
    """`use_request_prompt` False (the demo: a prompt stops tiny.en writing timestamps): the
    session's prompt and hotwords are accepted and never reach `transcribe_window`."""
    core = PromptRecorder(Script(long_reference(40.0, seg_s=3.0)))
    core.use_request_prompt = False
    options = SessionOptions(live=live, prompt="Agenda:", hotwords=("Ebenezer",))
    stream(core, audio(40.0), chunk_s=2.0, options=options)
    assert core.prompts and not [p for p in core.prompts if p and "Agenda" in p]
    assert not [p for p in core.prompts if p and "Ebenezer" in p]


def test_a_live_hop_arriving_mid_upload_is_served_before_the_upload_ends() -> None:
    """A user trial: a 3-minute upload froze every live session's captions for 7.3 s, since
    one step decoded the whole file. Now a step decodes one upload window at most, and a hop
    that arrives meanwhile goes before the upload's next window."""
    core = ScriptedCore(Script(long_reference(95.0)))
    core.open("up", UPLOAD)
    core.append("up", audio(95.0))
    core.end("up")
    core.open("live", SessionOptions())
    order = [(sid, type(e).__name__) for sid, e in core.step()]  # the upload's first window
    core.append("live", audio(3.0))  # a hop is due while the upload is in flight
    decodes_per_step = [core.num_hops]
    while core.has_work():
        before = core.num_hops
        order += [(sid, type(e).__name__) for sid, e in core.step()]
        decodes_per_step.append(core.num_hops - before)
    assert max(decodes_per_step) == 1  # a step is bounded by one window decode
    first_live = order.index(("live", "SegmentPartial"))
    assert first_live < order.index(("up", "TranscriptFinal"))
    assert order[0] == ("up", "TextDelta")  # the first window's text, sent at once


def test_an_upload_sends_each_windows_segments_as_it_is_decoded() -> None:
    """A streamed upload's text came all at once after its last window: a 90-minute demo
    upload showed nothing over SSE for its whole decode. Each window's finals now go out at
    its step, and their ids, times and texts are those of the final transcript."""
    core = ScriptedCore(Script(long_reference(95.0)))
    core.open("up", UPLOAD)
    core.append("up", audio(95.0))
    core.end("up")
    steps = []
    while core.has_work():
        steps.append([e for _, e in core.step()])
    final = steps[-1][-1]
    assert isinstance(final, TranscriptFinal) and len(steps) >= 4  # 4 windows of <= 30 s
    sent = [[e.segment for e in step if isinstance(e, SegmentFinal)] for step in steps[:-1]]
    assert all(sent), "every window of speech sends its segments at its own step"
    assert [seg for step in sent for seg in step] == list(final.segments)
    assert sent[0][-1].end_s <= 30.0  # the first step's: the first window's


def test_uploads_are_served_oldest_first() -> None:
    """Window by window, three 95-s uploads took turns and finished at steps 13, 14 and 15 (a
    review): the first waited nearly three times as long as alone. One after another they
    finish at steps 5, 10 and 15."""
    core = ScriptedCore(Script(long_reference(95.0)))
    for sid in ("a", "b", "c"):
        core.open(sid, UPLOAD)
        core.append(sid, audio(95.0))
        core.end(sid)
    finished: dict[str, int] = {}
    step = 0
    while core.has_work():
        step += 1
        for sid, event in core.step():
            if isinstance(event, TranscriptFinal):
                finished[sid] = step
    assert finished == {"a": 5, "b": 10, "c": 15}


def test_uploads_advance_while_live_hops_keep_coming() -> None:
    """Live first, but not forever: with a hop due in every live session before every step,
    each upload still gets a window once every live session has had a step."""
    core = ScriptedCore(Script(long_reference(95.0)))
    for sid in ("a", "b"):
        core.open(sid, SessionOptions())
    core.open("up", UPLOAD)
    core.append("up", audio(95.0))
    core.end("up")
    served: list[str] = []
    finished = None
    for step in range(30):
        for sid in ("a", "b"):
            core.append(sid, audio(1.0))
        before = core.num_hops
        out = core.step()
        assert core.num_hops - before <= 1
        served += {sid for sid, _ in out}
        if any(isinstance(e, TranscriptFinal) for _, e in out):
            finished = step
            break
    # 4 windows and the final: at most one step in three once both live sessions had theirs
    assert finished is not None and finished <= 3 * 5
    assert {"a", "b"} <= set(served)


def test_an_upload_gives_the_same_events_decoded_by_pieces() -> None:
    """The events of an upload decoded a window per step equal those of its whole transcript
    at once (`transcribe_upload`), deltas in order."""
    reference = long_reference(95.0)
    events = stream(ScriptedCore(Script(reference)), audio(95.0), chunk_s=5.0, options=UPLOAD)
    whole = upload_segments(
        ScriptedCore(Script(reference)).transcribe_upload(audio(95.0), None), 95.0
    )
    final = events[-1]
    assert isinstance(final, TranscriptFinal) and final.segments == whole
    assert [e.text for e in events[:-1] if isinstance(e, TextDelta)] == text_deltas(whole)


def test_idle_live_sessions_do_not_slow_an_upload() -> None:
    """The upload's turn came once as many live steps as open live sessions had run: with 50
    open and one streaming fast, an upload got one window per 50 hops (a review). It counts
    the sessions with a hop due."""
    core = ScriptedCore(Script(long_reference(95.0)))
    for k in range(50):
        core.open(f"idle{k}", SessionOptions())
    core.open("fast", SessionOptions())
    core.open("up", UPLOAD)
    core.append("up", audio(95.0))
    core.end("up")
    steps = 0
    done = False
    while not done and steps < 20:
        core.append("fast", audio(1.0))  # a hop due before every step
        done = any(isinstance(e, TranscriptFinal) for _, e in core.step())
        steps += 1
    assert done and steps <= 2 * 5  # 5 upload steps, each after at most one hop


def test_a_restored_session_decodes_from_its_finals_end_with_their_text_in_the_prompt() -> None:
    """A live session re-opened from stored finals ending at 9 s decodes no window before
    them, though all the audio comes again from 0, and its first prompt ends with their text
    (the demo, `use_committed_prompt` False, gets none)."""
    reference = long_reference(20.0, seg_s=3.0)  # turns end at 3.2, 6.2, 9.2, ...
    stored = tuple(
        Segment(r.start_s, r.end_s, r.speaker, r.text, id=f"seg-{i + 1:04d}", is_final=True)
        for i, r in enumerate(reference[:3])
    )
    windows: list[tuple[float, float]] = []

    class WindowRecorder(PromptRecorder):
        def transcribe_window(self, samples, offset_s, prompt):  # type: ignore[no-untyped-def]
            windows.append((offset_s, offset_s + samples.size / SAMPLE_RATE))
            return super().transcribe_window(samples, offset_s, prompt)

    core = WindowRecorder(Script(reference))
    options = SessionOptions(prompt="Agenda:", restore=LiveRestore(stored))
    events = stream(core, audio(16.0), options=options)
    assert windows and min(start for start, _ in windows) == pytest.approx(9.2)
    assert core.prompts[0] == f"Agenda: {' '.join(r.text for r in reference[:3])}"
    finals = [e.segment for e in events if isinstance(e, SegmentFinal)]
    assert [s.id for s in finals] == ["seg-0004", "seg-0005", "seg-0006"]
    assert [s.text for s in finals[:2]] == [r.text for r in reference[3:5]]
    assert reference[5].text.startswith(finals[2].text)  # cut by end() at 16 s
    final = events[-1]
    assert isinstance(final, TranscriptFinal) and final.segments[:3] == stored


class LoopsAtZero(ScriptedCore):
    """Decodes the window starting at 0 s as tiny.en decoded a trial's `loop_window.wav`, 27
    one-second "I don't know." and the last second's words; any other window by its script."""

    def transcribe_window(self, samples, offset_s, prompt):  # type: ignore[no-untyped-def]
        if offset_s > 0.0:
            return super().transcribe_window(samples, offset_s, prompt)
        self.num_hops += 1
        loop = [Segment(float(t), t + 1.0, "S01", "I don't know.") for t in range(27)]
        return [*loop, Segment(29.0, 30.0, "S01", "John Dashwood.")]


def test_a_loop_across_an_upload_windows_segments_is_decoded_again_past_its_first_copy() -> None:
    """A trial: 30 s decoded as 27 one-second "I don't know." then "John Dashwood.", the
    sentence spoken there lost; cut 1 s later the audio decoded right. The loop's first copy
    is kept (flagged) and the next window starts at its end."""
    reference = (
        Segment(0.0, 1.0, "S01", "I don't know."),
        Segment(1.0, 8.0, "S01", "I'm sorry."),
        Segment(14.1, 19.2, "S01", "If the reader will excuse me, I will say nothing."),
        Segment(29.0, 30.0, "S01", "John Dashwood."),
    )
    core = LoopsAtZero(Script(reference))
    final = stream(core, audio(30.0), chunk_s=30.0, options=UPLOAD)[-1]
    assert isinstance(final, TranscriptFinal)
    assert [(s.start_s, s.text) for s in final.segments] == [(s.start_s, s.text) for s in reference]
    assert [s.flags for s in final.segments] == [(SegmentFlag.REPETITION_CUT,), (), (), ()]
    assert core.num_hops == 2


def test_a_loop_at_an_upload_windows_end_is_decoded_again_with_the_next_window() -> None:
    """The scripted loop (the last segment three more times) at the first window's end: its
    first copy, cut by the window's end, is decoded again whole from its start."""
    reference = long_reference(60.0, seg_s=3.0)
    core = ScriptedCore(Script(reference, loop_hops=frozenset({0})))
    final = stream(core, audio(60.0), chunk_s=30.0, options=UPLOAD)[-1]
    assert isinstance(final, TranscriptFinal)
    assert [s.text for s in final.segments] == [s.text for s in reference]
    assert core.num_hops == 3  # 0-30 s (27.2-30.2 s cut at 30 s: looped), 27.2-57.2 s, the rest


def test_a_genuine_run_of_one_reply_survives_in_an_upload() -> None:
    """People say "Yeah." several times in a row: a run the loop rule takes for a loop is
    written again by the next window, from the first copy's end, so no copy is lost."""
    yeahs = tuple(Segment(2.0 + i, 2.8 + i, "S01", "Yeah.") for i in range(6))
    reference = (Segment(0.2, 1.8, "S01", "Shall we start?"), *yeahs, *long_reference(40.0)[2:])
    core = ScriptedCore(Script(reference))
    final = stream(core, audio(40.0), chunk_s=40.0, options=UPLOAD)[-1]
    assert isinstance(final, TranscriptFinal)
    assert [s.text for s in final.segments] == [s.text for s in reference]
    # three windows from 0, 2.8 and 3.8 s find the run (6, 5 and 4 copies), then 2: the rest
    assert core.num_hops <= 6
