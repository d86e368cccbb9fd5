"""LiveSession + commit policy + speaker mapping, driven by the scripted backend."""

from __future__ import annotations

import numpy as np
import pytest

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.backends.scripted import Revision, Script, ScriptedCore, scripted_hypothesis
from livemeet.errors import BadAudio, ProtocolError
from livemeet.session.live import LiveOptions, LiveSession, clean_hypothesis
from livemeet.transcriber import (
    Event,
    SegmentFinal,
    SegmentPartial,
    SessionOptions,
    TranscriptFinal,
)
from livemeet.transcript.commit import normalise_text
from livemeet.transcript.segments import Segment, SegmentFlag
from livemeet.transcript.speakers import overlap_s
from tests.backends.helpers import stream

# Contiguous speech by three speakers, labels in order of first appearance, 40 s.
REFERENCE = (
    Segment(0.4, 3.0, "S01", "Good morning everyone, let's get started with the review."),
    Segment(3.0, 6.2, "S02", "Thanks. The first item on the list is the budget for next year."),
    Segment(6.2, 9.0, "S01", "We are about ten percent over what we planned in March."),
    Segment(9.0, 13.5, "S03", "Then we should cut the travel costs and move the offsite online."),
    Segment(13.5, 16.0, "S02", "I agree, the offsite is the easiest thing to drop."),
    Segment(16.0, 21.0, "S01", "Fine. Let us also look at the hardware orders before we decide."),
    Segment(21.0, 27.5, "S03", "The laptops can wait a quarter, the servers cannot wait at all."),
    Segment(27.5, 32.0, "S02", "Then we order the servers now and the laptops in July."),
    Segment(32.0, 36.0, "S01", "Agreed. Thanks everyone, see you next week."),
)
DURATION_S = 37.0


def audio(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE), np.float32)


def ref_index(seg: Segment) -> int:
    """The reference segment an emitted segment belongs to (largest time overlap)."""
    overlaps = [overlap_s(seg, r) for r in REFERENCE]
    return int(np.argmax(overlaps))


def finals_of(events: list[Event]) -> list[Segment]:
    return [e.segment for e in events if isinstance(e, SegmentFinal)]


def check_invariants(events: list[Event], duration_s: float) -> None:
    assert isinstance(events[-1], TranscriptFinal)
    assert sum(isinstance(e, TranscriptFinal) for e in events) == 1
    finals = finals_of(events)
    assert [s.id for s in finals] == [f"seg-{i:04d}" for i in range(1, len(finals) + 1)]
    assert events[-1].segments == tuple(finals)  # finals immutable, never re-emitted
    starts = [s.start_s for s in finals]
    assert starts == sorted(starts)
    assert all(s.start_s <= s.end_s <= duration_s + 0.5 for s in finals)
    revs = [e.rev for e in events if isinstance(e, SegmentPartial)]
    assert revs == list(range(1, len(revs) + 1))
    # a label the client has seen is never renumbered: one label per reference segment
    label_of: dict[int, str] = {}
    for e in events:
        shown = e.segments if isinstance(e, SegmentPartial) else ()
        shown = (e.segment,) if isinstance(e, SegmentFinal) else shown
        for s in shown:
            assert label_of.setdefault(ref_index(s), s.speaker) == s.speaker, (s, label_of)
    # and no decode loop survives
    texts = [normalise_text(s.text) for s in finals]
    assert not any(texts[i] == texts[i + 1] == texts[i + 2] for i in range(len(texts) - 2))


def test_clean_script_commits_the_reference_exactly() -> None:
    core = ScriptedCore(Script(REFERENCE))
    events = stream(core, audio(DURATION_S), chunk_s=0.5)
    check_invariants(events, DURATION_S)
    finals = finals_of(events)
    assert [(s.speaker, s.text, s.start_s, s.end_s) for s in finals] == [
        (r.speaker, r.text, r.start_s, r.end_s) for r in REFERENCE
    ]
    # finals arrive live, not only at end(): all but the last commit before the stream ends
    end_index = next(i for i, e in enumerate(events) if isinstance(e, TranscriptFinal))
    first_final = next(i for i, e in enumerate(events) if isinstance(e, SegmentFinal))
    assert first_final < end_index - len(REFERENCE)
    assert events[-1].coverage == pytest.approx(36.0 / DURATION_S)


def test_faults_keep_invariants() -> None:
    script = Script(
        REFERENCE,
        revisions=tuple(
            Revision(h, i, "completely different words here")
            for h, i in [(3, 0), (7, 1), (8, 2), (15, 4), (20, 5)]
        ),
        eos_hops=frozenset({5, 11, 23}),
        loop_hops=frozenset({9, 17, 29}),
    )
    events = stream(ScriptedCore(script), audio(DURATION_S), chunk_s=0.5)
    check_invariants(events, DURATION_S)
    finals = finals_of(events)
    assert [s.text for s in finals] == [r.text for r in REFERENCE]
    # labels: a bijection onto the reference labels (contiguous speech always gives overlap)
    pairs = {(r.speaker, f.speaker) for r, f in zip(REFERENCE, finals, strict=True)}
    assert len(pairs) == len({r.speaker for r in REFERENCE})


@pytest.mark.parametrize("relabel_every", [2, 3, 5])
def test_relabelled_hops_never_flip_a_shown_label(relabel_every: int) -> None:
    # A speaker heard for the first time at a relabelled hop cannot be told from a returning
    # one, so labels need not match the reference here; they must never flip.
    script = Script(REFERENCE, relabel_every=relabel_every, eos_hops=frozenset({5, 11, 23}))
    events = stream(ScriptedCore(script), audio(DURATION_S))
    check_invariants(events, DURATION_S)
    assert [s.text for s in finals_of(events)] == [r.text for r in REFERENCE]


def test_unstable_text_is_force_committed_at_the_window_limit() -> None:
    # every hop misrecognises every segment differently: no two hypotheses ever agree
    revisions = tuple(
        Revision(h, i, f"noise {h} {i} words") for h in range(200) for i in range(len(REFERENCE))
    )
    core = ScriptedCore(Script(REFERENCE, revisions=revisions))
    events = stream(core, audio(DURATION_S))
    check_invariants(events, DURATION_S)
    end_index = len(events) - 1
    live_finals = [e for e in events[: end_index - 4] if isinstance(e, SegmentFinal)]
    assert live_finals, "the full window must force commits before end()"


def test_finalize_commits_everything_heard_so_far() -> None:
    events = stream(ScriptedCore(Script(REFERENCE)), audio(DURATION_S), finalize_at_s=10.0)
    check_invariants(events, DURATION_S)
    # right after finalize (at 10 s) the open tail is emptied by an empty partial
    empties = [e for e in events if isinstance(e, SegmentPartial) and not e.segments]
    assert empties
    idx = events.index(empties[0])
    committed = finals_of(events[:idx])
    assert committed[-1].end_s == pytest.approx(10.0, abs=0.01)
    assert committed[-1].text != REFERENCE[3].text  # cut mid-segment: what was heard so far


def test_finalize_commits_up_to_its_cut_while_audio_keeps_arriving() -> None:
    """A finalize fixes the audio heard by then: the commit stops there, however much audio
    arrives before a decode reaches it. It was applied only by a decode with no audio after
    it, so under a real-time stream it waited and committed words spoken after it (found by
    an independent trial)."""
    live = LiveSession(LiveOptions(hop_s=1.0))
    live.receive_audio(audio(4.0))
    in_flight = live.window()  # a hop decodes to 4 s while the client goes on
    live.receive_audio(audio(1.0))
    live.finalize()  # heard so far: 5 s
    live.receive_audio(audio(2.5))
    assert live.apply_hypothesis([Segment(0.5, 3.9, "S01", "before")]) == [
        SegmentPartial(1, (Segment(0.5, 3.9, "S01", "before"),))
    ]  # a decode short of the cut commits nothing
    assert in_flight.end_s == pytest.approx(4.0)
    assert live.hop_due()
    cut = live.window()
    assert cut.offset_s == 0.0 and cut.end_s == pytest.approx(5.0)  # not 7.5
    hyp = [Segment(0.5, 3.9, "S01", "before"), Segment(4.0, 5.6, "S02", "at the cut")]
    events = live.apply_hypothesis(hyp)
    assert [e.segment.text for e in events if isinstance(e, SegmentFinal)] == [
        "before",
        "at the cut",
    ]
    assert finals_of(events)[-1].end_s == pytest.approx(5.0)  # clamped to the cut
    assert live.committed_end_s == pytest.approx(5.0)
    after = live.window()  # the audio after the cut comes next
    assert after.offset_s == pytest.approx(5.0) and after.end_s == pytest.approx(7.5)


def test_finalizes_faster_than_decodes_are_each_reached() -> None:
    """A finalize every second while each decode takes 1.5 s: a cut that moved to every new
    finalize was never reached by the decode that was given the older one, so nothing was
    committed (0 of 30; a review). Each decode now reaches its cut and commits it."""
    live = LiveSession(LiveOptions(hop_s=1.0))
    live.receive_audio(audio(1.0))
    live.finalize()
    committed = []
    for i in range(30):
        window = live.window() if live.hop_due() else None
        live.receive_audio(audio(1.0))  # while it decodes, the client goes on and finalizes
        live.finalize()
        live.receive_audio(audio(0.5))
        if window is not None:
            hyp = [Segment(window.offset_s, window.end_s, "S01", f"part {i}")]
            committed += finals_of(live.apply_hypothesis(hyp))
    assert len(committed) >= 25
    ends = [seg.end_s for seg in committed]
    assert ends == sorted(ends)
    # each commit ends at a finalize's cut: a whole second or a half one, as the audio came
    assert all(round(2 * end) == 2 * end for end in ends)


def test_a_finalize_whose_audio_is_decoded_is_applied_by_flush() -> None:
    live = LiveSession(LiveOptions(hop_s=1.0))
    live.receive_audio(audio(2.0))
    live.window()
    live.finalize()  # at 2 s, the edge of the decode in flight
    live.receive_audio(audio(0.5))
    events = live.apply_hypothesis([Segment(0.0, 1.5, "S01", "all of it")])
    assert [s.text for s in finals_of(events)] == ["all of it"]
    assert not live.flush_due() and not live.hop_due()  # 0.5 s: less than a hop
    live.finalize()
    assert live.hop_due()
    assert live.window().end_s == pytest.approx(2.5)


WIDE = LiveOptions(hop_s=1.0, max_window_s=30.0)  # no forced commit in a trial's 25 s


def cut_session(shown: list[Segment], cut_s: float = 25.0) -> LiveSession:
    """A session shown `shown` as its partial by a hop to 24.95 s, then finalized at `cut_s`
    (more audio follows), with the window that reaches the cut handed out."""
    live = LiveSession(WIDE)
    live.receive_audio(audio(24.95))
    live.window()
    partial = [e for e in live.apply_hypothesis(shown) if isinstance(e, SegmentPartial)]
    assert [s.text for s in partial[-1].segments] == [s.text for s in shown]
    live.receive_audio(audio(cut_s - 24.95))
    live.finalize()
    live.receive_audio(audio(2.0))  # the client goes on while the cut is decoded
    assert live.window().end_s == pytest.approx(cut_s)
    return live


NARRATIVE = "The narrative would be tedious to him and painful to myself."


def test_a_finalize_keeps_the_shown_words_its_decode_left_out() -> None:
    """A trial (t28, Whisper tiny.en): a partial showed "Mr. John Dax" 23.54-24.9 s, the
    decode that reached the finalize at 25 s stopped at 22.54 s, and the commit dropped the
    partial. The finals hold it now, flagged `from_partial`, as after `end`."""
    shown = [Segment(19.88, 22.54, "S01", NARRATIVE), Segment(23.54, 24.9, "S01", "Mr. John Dax")]
    live = cut_session(shown)
    finals = finals_of(live.apply_hypothesis([Segment(19.88, 22.54, "S01", NARRATIVE)]))
    assert [(s.text, s.start_s, s.end_s, s.flags) for s in finals] == [
        (NARRATIVE, 19.88, 22.54, ()),
        ("Mr. John Dax", 23.54, 24.9, (SegmentFlag.FROM_PARTIAL,)),
    ]


@pytest.mark.parametrize("cut", ["finalize", "end"])
def test_a_cut_keeps_shown_words_a_stretched_last_segment_left_out(cut: str) -> None:
    """Whisper stretches a window's last segment over words it leaves out (a trial: "to
    myself." 21.86-24.94 s, "And Mr. John Dash" lost before a finalize at 25 s). A segment the
    partials showed ending earlier covers only that far: the shown words after it are kept,
    and it ends where they start."""
    shown = [
        Segment(19.88, 23.1, "S01", NARRATIVE),
        Segment(23.7, 24.6, "S01", "And Mr. John Dash"),
    ]
    live = cut_session(shown) if cut == "finalize" else LiveSession(WIDE)
    if cut == "end":
        live.receive_audio(audio(25.0))
        live.window()
        live.apply_hypothesis(shown)
        live.end()
        live.window()
    stretched = Segment(19.88, 24.88, "S01", NARRATIVE.lower())  # same words, another case
    finals = finals_of(live.apply_hypothesis([stretched]))
    assert [(s.text, s.start_s, s.end_s, s.flags) for s in finals] == [
        (NARRATIVE.lower(), 19.88, 23.7, ()),
        ("And Mr. John Dash", 23.7, 24.6, (SegmentFlag.FROM_PARTIAL,)),
    ]


def test_no_final_after_a_finalize_starts_before_its_cut() -> None:
    """A trial: the decode that reached the finalize at 25 s committed up to 23.36 s, the next
    window started there and a later final, 23.36-29.04 s, crossed the cut. The next window
    starts at the cut: the audio before it is the finalize's (protocol.md: "of no later
    audio"), even where its decode wrote none of it."""
    live = cut_session([Segment(19.36, 23.36, "S01", NARRATIVE)])
    finals = finals_of(live.apply_hypothesis([Segment(19.36, 23.36, "S01", NARRATIVE)]))
    assert [s.end_s for s in finals] == [23.36]
    after = live.window()
    assert after.offset_s == pytest.approx(25.0) and after.end_s == pytest.approx(27.0)
    # a decoder's first segment may claim audio before its window: it starts at the cut
    later = [Segment(23.36, 26.0, "S01", "wood had then leisure")]
    live.apply_hypothesis(later)
    live.end()
    live.window()
    finals = finals_of(live.apply_hypothesis(later))
    assert [(s.text, s.start_s) for s in finals] == [("wood had then leisure", 25.0)]
    assert all(s.start_s >= 25.0 or s.end_s <= 25.0 for s in live.finish().segments)


def test_a_finalize_applied_by_flush_keeps_the_shown_segments_too() -> None:
    """A finalize whose audio is decoded already (`flush`) commits the same as one a decode
    reaches: the retracted shown segment past the last decode is kept."""
    live = LiveSession(LiveOptions(hop_s=1.0))
    live.receive_audio(audio(3.0))
    live.window()
    live.apply_hypothesis([Segment(0.2, 1.0, "S01", "one"), Segment(1.5, 2.8, "S01", "two")])
    live.window()
    finals = finals_of(live.apply_hypothesis([Segment(0.2, 1.0, "S01", "one")]))
    live.finalize()
    finals += finals_of(live.flush())
    assert [(s.text, s.flags) for s in finals] == [
        ("one", ()),
        ("two", (SegmentFlag.FROM_PARTIAL,)),
    ]
    live.receive_audio(audio(1.0))
    assert live.window().offset_s == pytest.approx(3.0)


def test_end_without_audio() -> None:
    events = stream(ScriptedCore(Script(REFERENCE)), audio(0))
    assert events == [TranscriptFinal((), events[0].finish_reason, 0.0, 0.0)]


def test_end_mid_segment_commits_the_heard_part() -> None:
    events = stream(ScriptedCore(Script(REFERENCE)), audio(4.5), chunk_s=1.5)
    check_invariants(events, 4.5)
    finals = finals_of(events)
    assert [s.text for s in finals][0] == REFERENCE[0].text
    assert finals[-1].end_s == pytest.approx(4.5)


@pytest.mark.parametrize(
    ("last_decode", "kept"),
    [
        ((Segment(0.2, 2.0, "S01", "one two three"),), ["four five", "six"]),
        # the last decode reaches into "four five" (its own words for it): only "six" is kept
        ((Segment(0.2, 2.0, "S01", "one two three"), Segment(2.1, 3.5, "S01", "four")), ["six"]),
        ((), ["one two three", "four five", "six"]),
    ],
    ids=["stops_early", "reaches_in", "writes_nothing"],
)
def test_the_final_keeps_what_the_partials_showed_past_the_last_decode(
    last_decode: tuple[Segment, ...], kept: list[str]
) -> None:
    """The decode after `end` (of all the audio) may stop before segments the client was
    shown (a trial: Whisper tiny's last window dropped ~9 s of a meeting the partials had
    shown; `stream` still exited 0): the final holds them, flagged `from_partial`."""
    shown = [
        Segment(0.2, 2.0, "S01", "one two three"),
        Segment(2.2, 3.8, "S01", "four five"),
        Segment(4.0, 4.8, "S01", "six"),
    ]
    live = LiveSession(LiveOptions(hop_s=1.0))
    live.receive_audio(audio(5.0))
    live.window()
    partial = [e for e in live.apply_hypothesis(shown) if isinstance(e, SegmentPartial)]
    assert [s.text for s in partial[-1].segments] == [s.text for s in shown]
    live.end()
    live.window()
    finals = finals_of(live.apply_hypothesis(last_decode))
    assert live.ended
    texts = [s.text for s in finals]
    assert texts == [s.text for s in last_decode] + kept
    for seg in finals:
        from_partial = SegmentFlag.FROM_PARTIAL in seg.flags
        assert from_partial == (seg.text in kept), seg
    assert live.finish().segments == tuple(finals)


def test_a_last_decode_that_covers_the_shown_segments_keeps_none_of_them() -> None:
    live = LiveSession(LiveOptions(hop_s=1.0))
    live.receive_audio(audio(5.0))
    live.window()
    live.apply_hypothesis([Segment(0.2, 2.0, "S01", "one"), Segment(2.2, 3.8, "S01", "two")])
    live.end()
    live.window()
    last = [Segment(0.2, 2.0, "S01", "one"), Segment(2.2, 4.5, "S01", "two three")]
    finals = finals_of(live.apply_hypothesis(last))
    assert [(s.text, s.flags) for s in finals] == [("one", ()), ("two three", ())]


def test_end_is_pending_until_the_decode_that_ends_the_session() -> None:
    live = LiveSession(LiveOptions(hop_s=1.0))
    live.receive_audio(audio(0.5))
    live.finalize()
    assert not live.end_pending  # a finalize is not an end
    live.window()
    live.apply_hypothesis([])
    live.receive_audio(audio(0.5))
    live.end()
    assert live.end_pending and live.hop_due()
    live.window()
    live.apply_hypothesis([])
    assert live.ended and not live.end_pending


def test_hop_due_every_hop_of_audio_and_skipped_without_audio() -> None:
    live = LiveSession(LiveOptions(hop_s=1.0))
    assert not live.hop_due()
    live.receive_audio(audio(0.6))
    assert not live.hop_due()
    live.receive_audio(audio(0.4))
    assert live.hop_due()
    win = live.window()
    assert win.offset_s == 0 and win.end_s == pytest.approx(1.0) and win.prompt is None
    live.apply_hypothesis([])
    assert not live.hop_due() and not live.flush_due()
    live.finalize()
    assert live.flush_due() and not live.hop_due()
    live.flush()
    assert not live.flush_due()


def test_silence_never_grows_the_window_past_the_limit() -> None:
    live = LiveSession(LiveOptions(hop_s=1.0, max_window_s=25.0))
    for _ in range(60):
        live.receive_audio(audio(1.0))
        assert live.hop_due()
        win = live.window()
        assert len(win.samples) <= 25.0 * SAMPLE_RATE
        assert live.apply_hypothesis([]) == []


def test_prompt_is_recent_committed_text() -> None:
    live = LiveSession(LiveOptions(prompt_chars=20))
    live.receive_audio(audio(3.0))
    live.window()
    live.apply_hypothesis([Segment(0, 1, "S01", "one two three four five six")])
    live.finalize()
    live.flush()
    live.receive_audio(audio(1.0))
    win = live.window()
    assert win.prompt == "one two three four five six"[-20:]
    assert win.offset_s == pytest.approx(3.0)  # at the cut, not at the final's end


def test_bad_input_is_rejected() -> None:
    live = LiveSession()
    with pytest.raises(BadAudio):
        live.receive_audio(np.zeros((2, 10), np.float32))
    other = LiveSession()
    other.receive_audio(audio(1.0))
    for bad in (np.nan, np.inf):  # checked once, here: decodes take the audio as checked
        chunk = audio(0.5)
        chunk[100] = bad
        with pytest.raises(BadAudio, match="NaN or infinite"):
            other.receive_audio(chunk)
    assert other.window().samples.size == 16_000  # the rejected chunks were not kept
    live.end()
    with pytest.raises(ProtocolError):
        live.receive_audio(audio(1))
    with pytest.raises(RuntimeError):
        live.apply_hypothesis([])
    with pytest.raises(ValueError):
        LiveSession(LiveOptions(hop_s=0))


def test_a_second_end_is_refused_at_once_while_the_first_waits_for_its_decode() -> None:
    """`end` refused a second end only once the first was applied (the decode reaching its
    cut done), and took one that came while the first waited for that decode as a no-op; so
    did `finalize`. Both are now refused at once, with the ProtocolError they get after the
    end is applied (as audio after end always was), and the first end goes on to its final."""
    live = LiveSession(LiveOptions(hop_s=1.0))
    live.receive_audio(audio(2.0))

    def refused() -> None:
        with pytest.raises(ProtocolError, match="end after end"):
            live.end()
        with pytest.raises(ProtocolError, match="audio after end"):
            live.receive_audio(audio(0.5))
        with pytest.raises(ProtocolError, match="finalize after end"):
            live.finalize()

    live.end()
    refused()  # no decode handed out yet
    win = live.window()
    refused()  # its decode in flight
    assert live.end_pending and win.end_s == pytest.approx(2.0)
    finals = finals_of(live.apply_hypothesis([Segment(0.2, 1.8, "S01", "one two")]))
    assert live.ended and [s.text for s in finals] == ["one two"]
    refused()  # applied
    assert [s.text for s in live.finish().segments] == ["one two"]


def test_clean_hypothesis_clips_and_cuts_loops() -> None:
    hyp = (
        [Segment(0.5, 2, "S01", "a"), Segment(1.0, 9, "S01", "b")]
        + [Segment(2, 3, "S01", "Again.")] * 4
        + [Segment(3, 4, "S01", "  "), Segment(9, 10, "S01", "late")]
    )
    out = clean_hypothesis(hyp, window_start_s=1.0, edge_s=5.0)
    assert [s.text for s in out] == ["a", "b", "Again.", "Again."]
    assert out[0].start_s == 1.0 and out[1].end_s == 5.0 and out[1].flags


def test_clean_hypothesis_keeps_a_start_stamp_within_the_tolerance_past_the_edge() -> None:
    """Stamps have 2 decimals: speech from 4.996 s is written [5.00], past an edge at 4.995 s.
    With a tolerance of one stamp step such a segment is kept, its start clamped to the edge;
    one a whole step past it is not; without one, neither is."""
    hyp = [Segment(5.0, 5.0, "S01", "b"), Segment(5.005, 5.5, "S01", "c")]
    kept = clean_hypothesis(hyp, 0.0, 4.995, start_tolerance_s=0.01)
    assert [(s.start_s, s.end_s, s.text) for s in kept] == [(4.995, 4.995, "b")]
    assert (
        clean_hypothesis([Segment(5.0, 5.2, "S01", "b")], 0.0, 4.99, start_tolerance_s=0.01) == ()
    )
    assert clean_hypothesis(hyp, 0.0, 4.995) == ()


def test_only_the_last_decode_keeps_a_segment_starting_at_the_edge() -> None:
    """A segment whose start stamp is the edge's, rounded up, is kept only by the decode
    `end` waits on: before it the next hop writes it again from more audio, and keeping it
    would commit text from no audio at a forced window commit (found by a review: a final
    "So" at [3.0, 3.0] and the window start moved past the commit horizon)."""
    live = LiveSession(LiveOptions(hop_s=1.0, max_window_s=3.0))
    events = []
    for _ in range(3):
        live.receive_audio(np.zeros(SAMPLE_RATE + 64, np.float32))  # edges off the stamp grid
        edge_s = live.window().end_s
        events += live.apply_hypothesis([Segment(edge_s + 0.004, edge_s + 0.004, "S01", "So")])
    assert not [e for e in events if isinstance(e, SegmentFinal)]
    assert live.committed_end_s < live.edge_s - 0.5  # the horizon kept: nothing committed
    live.end()
    edge_s = live.window().end_s
    events = live.apply_hypothesis([Segment(edge_s + 0.004, edge_s + 0.004, "S01", "So")])
    finals = [e.segment for e in events if isinstance(e, SegmentFinal)]
    assert [(s.start_s, s.text) for s in finals] == [(pytest.approx(edge_s), "So")]


def test_options_hop_is_used() -> None:
    core = ScriptedCore(Script(REFERENCE))
    events = stream(core, audio(8.0), options=SessionOptions(hop_s=2.0), chunk_s=0.5)
    assert core.num_hops == 4  # one per 2 s; end() adds none (no new audio since)
    check_invariants(events, 8.0)


def _hop(live: LiveSession, seconds: float, hyp: list[Segment], labels: tuple[str, ...] = ()):
    """One hop as MossCore runs it: the window, then the hypothesis past the last final."""
    offset = live.window().offset_s
    kept = [s for s in hyp if (s.start_s + s.end_s) / 2 > offset]
    live.receive_audio(np.zeros(int(seconds * SAMPLE_RATE), np.float32))
    return live.apply_hypothesis(kept, labels)


def test_labels_written_in_session_terms_keep_their_meaning() -> None:
    """A decode after a forced transcript prefix writes the prefix's session labels: they are
    kept as they are (a returning speaker with no overlap to go on is not renumbered through
    votes cast when labels meant something else); a label the prefix lacks is still mapped."""

    def seg(a: float, b: float, spk: str, text: str) -> Segment:
        return Segment(start_s=a, end_s=b, speaker=spk, text=text)

    live = LiveSession(LiveOptions(hop_s=1.0))
    live.receive_audio(np.zeros(3 * SAMPLE_RATE, np.float32))
    _hop(live, 1.0, [seg(1.6, 2.0, "S01", "bee one")])  # B heard first: S01 = B here
    full = [seg(0.0, 1.5, "S01", "ay one"), seg(1.6, 2.0, "S02", "bee one")]
    _hop(live, 1.0, full)
    _hop(live, 2.0, full)
    labels = {s.text: s.speaker for s in live.committed}
    assert labels == {"ay one": "S02", "bee one": "S01"}
    # A (S02 in the session, and in the prefix the decode saw) speaks again, then a newcomer
    # whom this decode calls S01, a label the prefix does not give it
    tail = [seg(3.0, 4.0, "S02", "ay two"), seg(4.2, 5.0, "S03", "cee one")]
    for _ in range(2):
        _hop(live, 1.0, tail, labels=("S02", "S01"))
    got = {s.text: s.speaker for s in (*live.committed, *live._commit.tail)}
    assert got["ay two"] == "S02" and got["cee one"] == "S03"


def test_a_loop_across_the_commit_point_is_cut() -> None:
    """Copies of the last committed text at the start of a hypothesis count toward the
    LOOP_MAX_REPEATS run: a decode that sees only the tail cannot grow a loop past it."""
    thanks = [Segment(float(i), i + 0.9, "S01", "Thank you.") for i in range(4)]
    assert [s.start_s for s in clean_hypothesis(thanks, 0.0, 10.0)] == [0.0, 1.0]
    assert clean_hypothesis(thanks, 0.0, 10.0, ["one", "Thank you.", "Thank you."]) == ()
    kept = clean_hypothesis(thanks, 0.0, 10.0, ["Thank you.", "one"])
    assert [s.start_s for s in kept] == [0.0, 1.0]
    assert len(clean_hypothesis(thanks, 0.0, 10.0, ["Thank you!"])) == 1


def test_hypotheses_in_marker_time_are_clipped_and_committed_at_the_marker_edge() -> None:
    """A backend writing marker time (stamps `time_scale` times the audio's: MOSS-TD's 1.008,
    exaggerated here to 1.5) has its speech near the audio edge kept and committed against the
    edge in marker time, and the next window starts at the audio time of the committed end;
    read as audio time, the same stamps lose that speech (DESIGN 5.5)."""

    def seg(a: float, b: float, text: str) -> Segment:
        return Segment(start_s=a, end_s=b, speaker="S01", text=text)

    # speech at 0-4, 5-9 and 12-17.5 s of audio, in stamps 1.5 times that
    hyp = [seg(0.0, 6.0, "one"), seg(7.5, 13.5, "two"), seg(18.0, 26.25, "three")]
    outcome = {}
    for scale in (1.0, 1.5):
        live = LiveSession(LiveOptions(hop_s=1.0, time_scale=scale))
        live.receive_audio(np.zeros(20 * SAMPLE_RATE, np.float32))
        for _ in range(2):  # two agreeing hypotheses commit
            live.window()
            events = live.apply_hypothesis(hyp)
            live.receive_audio(np.zeros(SAMPLE_RATE, np.float32))
        outcome[scale] = (live, events)
    live, _ = outcome[1.5]
    assert [(s.text, s.start_s, s.end_s) for s in live.committed] == [
        ("one", 0.0, 6.0),
        ("two", 7.5, 13.5),
        ("three", 18.0, 26.25),
    ]
    assert all(not s.flags for s in live.committed)
    assert live.window().offset_s == pytest.approx(26.25 / 1.5)  # back in audio time
    flat, _ = outcome[1.0]
    shown = (*flat.committed, *flat._commit.tail)
    assert "three" not in [s.text for s in shown if not s.flags]  # clamped or lost
    with pytest.raises(ValueError, match="time_scale"):
        LiveSession(LiveOptions(time_scale=0.0))


def test_preview_sends_a_closed_segment_before_the_decode_ends() -> None:
    """`preview` shows the segments a running decode has closed once one reaches past the last
    partial, in session labels only; the decode's own `apply_hypothesis` then sends nothing
    new for the same tail, and commits as without the preview."""

    def seg(a: float, b: float, spk: str, text: str) -> Segment:
        return Segment(start_s=a, end_s=b, speaker=spk, text=text)

    one, two = seg(0.2, 1.5, "S01", "one"), seg(1.7, 2.8, "S02", "two")
    labels = ("S01", "S02")
    runs = {}
    for use_preview in (False, True):
        live = LiveSession(LiveOptions(hop_s=1.0))
        live.receive_audio(np.zeros(2 * SAMPLE_RATE, np.float32))
        live.window()
        first = live.apply_hypothesis([one], labels)
        assert [type(e) for e in first] == [SegmentPartial]
        live.receive_audio(np.zeros(SAMPLE_RATE, np.float32))
        live.window()
        early = []
        if use_preview:
            assert live.preview([one], labels) == []  # nothing past the partial sent
            assert live.preview([one, two], ("S01",)) == []  # S02 would need mapping
            early = live.preview([one, two], labels)
            assert [type(e) for e in early] == [SegmentPartial]
            assert [s.text for s in early[0].segments] == ["one", "two"]
            assert all(not s.is_final and not s.id for s in early[0].segments)
            assert live.preview([one, two], labels) == []  # sent already
        late = live.apply_hypothesis([one, two], labels)
        runs[use_preview] = (early, late, live.committed)
    (_, plain_late, plain_committed), (early, late, committed) = runs[False], runs[True]
    assert committed == plain_committed  # the preview commits nothing
    # the decode's end sends its finals, and a partial only where the tail changed since
    assert [e for e in late if not isinstance(e, SegmentPartial)] == [
        e for e in plain_late if not isinstance(e, SegmentPartial)
    ]
    # "one" commits at the decode's end: the tail shrinks to "two", sent once, next rev
    partials = [e for e in late if isinstance(e, SegmentPartial)]
    assert [[s.text for s in e.segments] for e in partials] == [["two"]]
    assert partials[0].rev == early[0].rev + 1
    assert [s.text for s in finals_of(late)] == ["one"]


def test_preview_keeps_the_speaker_evidence_of_retracted_segments() -> None:
    """A segment the client saw and a later, shorter decode retracted (an early stop) still
    counts when the next decode maps a speaker it writes under a new label; a preview in
    that decode must not drop it (the speech shown as S02 would come back as S03)."""

    def seg(a: float, b: float, spk: str, text: str) -> Segment:
        return Segment(start_s=a, end_s=b, speaker=spk, text=text)

    tails = {}
    for use_preview in (False, True):
        live = LiveSession(LiveOptions(hop_s=1.0))
        live.receive_audio(np.zeros(6 * SAMPLE_RATE, np.float32))
        live.window()
        live.apply_hypothesis([seg(0.2, 1.5, "S01", "one"), seg(1.7, 5.5, "S02", "two")])
        live.receive_audio(np.zeros(SAMPLE_RATE, np.float32))
        live.window()
        live.apply_hypothesis([seg(0.2, 1.5, "S01", "one")])  # stops early: "two" retracted
        live.receive_audio(np.zeros(SAMPLE_RATE, np.float32))
        live.window()
        uh, two = seg(1.6, 2.0, "S01", "uh"), seg(2.0, 5.5, "S05", "two")
        if use_preview:
            assert [type(e) for e in live.preview([uh], {"S01"})] == [SegmentPartial]
        events = live.apply_hypothesis([uh, two], {"S01"})
        tails[use_preview] = [e for e in events if isinstance(e, SegmentPartial)][-1].segments
    assert [(s.speaker, s.text) for s in tails[True]] == [("S01", "uh"), ("S02", "two")]
    assert tails[True] == tails[False]


def test_preview_clips_at_the_edge_in_marker_time() -> None:
    """A backend writing marker time (`time_scale` 1.5 here) is clipped at the edge in marker
    time, as `apply_hypothesis` does (in audio time the segment would end at 2.0)."""
    live = LiveSession(LiveOptions(hop_s=1.0, time_scale=1.5))
    live.receive_audio(np.zeros(2 * SAMPLE_RATE, np.float32))
    live.window()
    # ends at 2.8 in marker time: inside the 2-s audio edge (3.0 in marker time)
    events = live.preview([Segment(start_s=0.3, end_s=2.8, speaker="S01", text="one")], {"S01"})
    assert [s.end_s for s in events[0].segments] == [2.8]


def test_a_final_does_not_move_the_next_window_past_the_later_decodes_speech() -> None:
    """Two decodes agree on "ask not", shown as 0-7.9 and re-decoded as 0-7.5 with "ask what"
    from 7.5. The final took the shown times (a review), so the next window started at 7.9 and
    7.5-7.9 of "ask what" was decoded by no later hop. It starts at 7.5 now."""
    live = LiveSession(LiveOptions(hop_s=1.0))
    live.receive_audio(audio(9.0))
    assert live.window().offset_s == 0.0
    live.apply_hypothesis([Segment(0, 7.9, "S01", "ask not"), Segment(7.9, 8.5, "S01", "ask")])
    live.receive_audio(audio(1.0))
    live.window()
    events = live.apply_hypothesis(
        [Segment(0, 7.5, "S01", "ask not"), Segment(7.5, 9.5, "S01", "ask what")]
    )
    assert [(s.start_s, s.end_s) for s in finals_of(events)] == [(0, 7.5)]
    live.receive_audio(audio(1.0))
    assert live.window().offset_s == 7.5


# -- restored sessions (a restarted server, DESIGN 5.9) ----------------------------------------


def feed(live: LiveSession, start_s: float, stop_s: float, script: Script) -> list[Event]:
    """Append audio from `start_s` to `stop_s` in 0.5 s chunks, decoding each due hop with the
    scripted backend's pure decode (what `RedecodeCore` does), and return the events."""
    events: list[Event] = []
    t = start_s
    while t < stop_s - 1e-9:
        step = min(0.5, stop_s - t)
        live.receive_audio(audio(step))
        t += step
        events += decode_due(live, script)
    return events


def decode_due(live: LiveSession, script: Script) -> list[Event]:
    if live.hop_due():
        win = live.window()
        return live.apply_hypothesis(scripted_hypothesis(script, win.offset_s, win.end_s, 0))
    return live.flush()


def close(live: LiveSession, script: Script) -> list[Event]:
    """`end()`, then decode until the session ends; the events, `finish()` last."""
    live.end()
    events: list[Event] = []
    while not live.ended:
        events += decode_due(live, script)
    return [*events, live.finish()]


@pytest.mark.parametrize("cut_s", [7.0, 12.0, 20.5])
def test_a_restored_session_goes_on_as_the_uninterrupted_one(cut_s: float) -> None:
    """A session interrupted at `cut_s` (its finals stored) and restored from them, fed the same
    audio again from 0 and then the rest, commits what the uninterrupted session commits:
    same texts, times, labels and ids. No restored final comes out again, new ids follow
    theirs, a returning speaker keeps its stored label and one heard for the first time
    (S03, first at 9 s) gets a new one."""
    script = Script(REFERENCE)
    whole = LiveSession(LiveOptions(hop_s=1.0))
    feed(whole, 0.0, DURATION_S, script)
    want = close(whole, script)[-1]
    assert isinstance(want, TranscriptFinal) and len(want.segments) == len(REFERENCE)
    first = LiveSession(LiveOptions(hop_s=1.0))
    feed(first, 0.0, cut_s, script)
    stored = first.committed
    assert 0 < len(stored) < len(REFERENCE)
    restored = LiveSession(LiveOptions(hop_s=1.0), restored=stored)
    assert restored.committed == stored
    assert restored.committed_end_s == stored[-1].end_s
    events = feed(restored, 0.0, DURATION_S, script) + close(restored, script)
    new = finals_of(events)
    assert not {s.id for s in new} & {s.id for s in stored}
    assert [s.id for s in new] == [f"seg-{i:04d}" for i in range(len(stored) + 1, 10)]
    final = events[-1]
    assert isinstance(final, TranscriptFinal) and final.segments == (*stored, *new)
    assert final.segments == want.segments  # ids, texts, times and labels alike
    assert [s.speaker for s in final.segments] == [r.speaker for r in REFERENCE]
    # the open tail never shows a restored segment's words again
    partials = [s for e in events if isinstance(e, SegmentPartial) for s in e.segments]
    assert all(s.start_s >= stored[-1].end_s for s in partials)


def finals_to_9s() -> tuple[Segment, ...]:
    """The finals a session committed of REFERENCE's first 12 s: they end at 9 s."""
    first = LiveSession(LiveOptions(hop_s=1.0))
    feed(first, 0.0, 12.0, Script(REFERENCE))
    stored = first.committed
    assert stored[-1].end_s == 9.0
    return tuple(stored)


def test_a_restored_session_decodes_nothing_before_the_end_of_its_finals() -> None:
    """Audio received again up to the restored finals' end (9 s) is not decoded as an open
    window: no hop is due until a hop of audio past it, `window()` refuses, a finalize there
    has nothing to cut, and an end there is applied without a decode. The window past it
    starts at that end."""
    stored = finals_to_9s()
    live = LiveSession(LiveOptions(hop_s=1.0), restored=stored)
    assert not live.hop_due() and not live.flush_due() and live.new_samples == 0
    live.receive_audio(audio(8.0))
    assert not live.hop_due() and live.new_samples == 0
    assert not live._chunks  # audio before the window is not kept
    with pytest.raises(RuntimeError, match="no open window"):
        live.window()
    live.finalize()  # everything up to here is final: nothing to cut (an end is: below)
    assert not live.flush_due() and not live.hop_due()
    live.receive_audio(audio(1.5))
    assert not live.hop_due() and live.new_samples == SAMPLE_RATE // 2
    live.receive_audio(audio(0.5))
    assert live.hop_due() and live.new_samples == SAMPLE_RATE
    win = live.window()
    assert win.offset_s == 9.0 and win.end_s == 10.0
    assert win.prompt is not None and win.prompt.endswith(REFERENCE[2].text)
    live.apply_hypothesis([])

    ended = LiveSession(LiveOptions(hop_s=1.0), restored=stored)
    ended.receive_audio(audio(4.0))
    ended.end()
    assert ended.flush() == [] and ended.ended
    assert ended.finish().segments == stored


def test_finalizes_fed_again_behind_the_restored_finals_leave_both_cuts_past_them() -> None:
    """A rebuild feeds a session its journaled finalizes again, faster than it decodes. One
    behind the restored finals (2 s; they end at 9) took one of the two cut slots, so of the
    two past them (10 and 11 s) the first was replaced by the second and a final could cross
    it (a review). Now each cut past the finals is reached by its own decode."""
    stored = finals_to_9s()
    live = LiveSession(LiveOptions(hop_s=1.0), restored=stored)
    for edge_s in (2.0, 10.0, 11.0):  # audio to each, then its finalize, no decode between
        live.receive_audio(audio(edge_s - live.edge_s))
        live.finalize()
    first_cut = live.window()
    assert first_cut.offset_s == 9.0 and first_cut.end_s == 10.0
    live.apply_hypothesis([Segment(9.2, 10.0, "S01", "nine to ten")])
    second_cut = live.window()
    assert second_cut.offset_s == 10.0 and second_cut.end_s == 11.0


def test_a_restored_window_starts_at_the_audio_time_of_the_finals_end() -> None:
    """Restored finals carry the backend's timestamps: in marker time (`time_scale`, 1.5
    here) the window starts at their end's audio time."""
    stored = (Segment(0.0, 9.0, "S01", "one", id="seg-0001", is_final=True),)
    live = LiveSession(LiveOptions(hop_s=1.0, time_scale=1.5), restored=stored)
    live.receive_audio(audio(6.5))
    assert not live.hop_due()
    live.receive_audio(audio(0.5))
    assert live.hop_due() and live.window().offset_s == pytest.approx(6.0)


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ((Segment(0.0, 1.0, "S01", "partial"),), "not a final with an id"),
        ((Segment(0.0, 1.0, "S01", "a", id="seg-0001", is_final=True),) * 2, "repeats the id"),
        (
            (
                Segment(2.0, 3.0, "S01", "b", id="seg-0001", is_final=True),
                Segment(1.0, 2.0, "S01", "a", id="seg-0002", is_final=True),
            ),
            "before the one ahead",
        ),
    ],
)
def test_restored_finals_are_checked(stored: tuple[Segment, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LiveSession(restored=stored)
