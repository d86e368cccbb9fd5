"""The scripted backend's revision of a live session (DESIGN 5.7), at the core."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.backends.scripted import DEFAULT_SCRIPT, ScriptedCore
from livemeet.transcriber import Event, SessionOptions, TranscriptFinal, TranscriptRevised
from livemeet.transcript.segments import Segment, SegmentFlag
from tests.backends.helpers import run_to_idle, stream


def test_a_revision_follows_the_final_and_ends_the_session() -> None:
    core = ScriptedCore()
    events = stream(
        core, np.zeros(12 * SAMPLE_RATE, np.float32), options=SessionOptions(revise=True)
    )
    final, revised = events[-2:]
    assert isinstance(final, TranscriptFinal) and final.revision
    assert isinstance(revised, TranscriptRevised)
    assert revised.supersedes == tuple(s.id for s in final.segments)
    assert [s.text for s in revised.segments] == [s.text for s in DEFAULT_SCRIPT.reference]
    assert core.num_sessions == 0


def test_a_revision_past_the_audio_is_clamped_to_it_and_flagged() -> None:
    """A re-decode's segment that ends past the meeting's audio (a demo or scripted backend's
    revision: its times are the decoder's own) ends at the audio's end, flagged END_CLAMPED,
    and one that starts there is dropped, as a hop's hypothesis is: a trial's revised segment
    ended at 36.3 s on 35.05 s of audio."""
    revised = (
        Segment(0.0, 5.0, "S01", "Good morning."),
        Segment(8.0, 13.5, "S02", "Past the end."),
        Segment(12.0, 14.0, "S01", "After the end."),
    )
    core = ScriptedCore(replace(DEFAULT_SCRIPT, revised=revised))
    events = stream(
        core, np.zeros(12 * SAMPLE_RATE, np.float32), options=SessionOptions(revise=True)
    )
    done = events[-1]
    assert isinstance(done, TranscriptRevised)
    assert [(s.start_s, s.end_s) for s in done.segments] == [(0.0, 5.0), (8.0, 12.0)]
    assert SegmentFlag.END_CLAMPED in done.segments[1].flags
    assert SegmentFlag.END_CLAMPED not in done.segments[0].flags


def test_an_abort_after_the_final_cancels_the_revision() -> None:
    core = ScriptedCore()
    core.open("s", SessionOptions(revise=True))
    core.append("s", np.zeros(12 * SAMPLE_RATE, np.float32))
    core.end("s")
    out: list[tuple[str, Event]] = []
    while not any(isinstance(e, TranscriptFinal) for _, e in out):
        out.extend(core.step())
    assert core.has_work()  # the revision is due
    core.abort("s")
    run_to_idle(core, out)
    assert not any(isinstance(e, TranscriptRevised) for _, e in out)
    assert core.num_sessions == 0


def test_without_revise_or_audio_the_final_is_terminal() -> None:
    core = ScriptedCore()
    events = stream(core, np.zeros(4 * SAMPLE_RATE, np.float32))
    assert isinstance(events[-1], TranscriptFinal) and not events[-1].revision
