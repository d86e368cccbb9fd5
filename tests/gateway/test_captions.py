"""livemeet.gateway.captions: a captions subscriber's bounded outbox (the fan-out policy)."""

from __future__ import annotations

import pytest

from livemeet.audio.constants import MAX_MERGED_SPEAKERS, MAX_NAMED_SPEAKERS
from livemeet.errors import NotFound, QueueFull
from livemeet.gateway.captions import CaptionsOutbox, is_terminal
from livemeet.gateway.live_protocol import SpeakerMerged, SpeakerRenamed
from livemeet.gateway.live_replay import ReplayState
from livemeet.transcriber import (
    Error,
    SegmentFinal,
    SegmentPartial,
    TextDelta,
    TranscriptFinal,
    TranscriptRevised,
)
from livemeet.transcript.segments import FinishReason, Segment


def final(i: int) -> SegmentFinal:
    return SegmentFinal(Segment(i, i + 1, "S01", f"f{i}", id=f"seg-{i:04d}", is_final=True))


def partial(rev: int) -> SegmentPartial:
    return SegmentPartial(rev, (Segment(rev, rev + 1, "S01", f"p{rev}"),))


def drain(outbox: CaptionsOutbox) -> list[object]:
    items = []
    while (item := outbox.pop()) is not None:
        items.append(item)
    return items


def test_a_newer_partial_replaces_the_unsent_one_and_goes_after_the_finals() -> None:
    outbox = CaptionsOutbox(max_finals=8)
    outbox.push(partial(1))
    outbox.push(final(0))
    outbox.push(partial(2))
    outbox.push(final(1))
    outbox.push(partial(3))
    assert drain(outbox) == [final(0), final(1), partial(3)]
    assert len(outbox) == 0 and outbox.num_finals == 0


def test_a_subscriber_too_far_behind_on_finals_is_closed_with_queue_full() -> None:
    outbox = CaptionsOutbox(max_finals=3)
    for i in range(3):
        outbox.push(final(i))
    assert outbox.pop() == final(0)  # one sent: room for one more
    outbox.push(final(3))
    assert not outbox.closed
    outbox.push(final(4))  # the fourth unsent
    assert outbox.closed
    items = drain(outbox)
    assert len(items) == 1 and isinstance(items[0], QueueFull)  # the backlog is dropped
    assert "reconnect" in items[0].message
    outbox.push(final(5))
    outbox.push(TranscriptFinal((), FinishReason.STOP, 0.0, 1.0))
    assert drain(outbox) == []  # nothing after the error


def test_the_terminal_event_always_queues_last_and_closes() -> None:
    outbox = CaptionsOutbox(max_finals=1)
    outbox.push(final(0))
    done = TranscriptFinal((final(0).segment,), FinishReason.STOP, 1.0, 1.0)
    outbox.push(done)  # not refused for the full queue of finals
    outbox.push(partial(9))
    assert drain(outbox) == [final(0), done]
    assert is_terminal(done) and is_terminal(Error("x", "y")) and is_terminal(NotFound("z"))
    assert not is_terminal(final(0))


def test_events_captions_do_not_carry_are_dropped() -> None:
    outbox = CaptionsOutbox(max_finals=1)
    outbox.push(TextDelta("upload text"))
    assert len(outbox) == 0


def test_a_final_that_promises_a_revision_keeps_the_queue_open_for_it() -> None:
    outbox = CaptionsOutbox(max_finals=1)
    promise = TranscriptFinal((), FinishReason.STOP, 1.0, 1.0, revision=True)
    revised = TranscriptRevised((), ("seg-0001",))
    outbox.push(promise)
    assert not is_terminal(promise)
    outbox.push(revised)
    outbox.push(partial(9))  # nothing after the revision
    assert drain(outbox) == [promise, revised]
    assert is_terminal(revised)


def test_fail_drops_the_backlog() -> None:
    outbox = CaptionsOutbox(max_finals=4)
    outbox.push(final(0))
    outbox.push(partial(1))
    outbox.fail(NotFound("gone"))
    items = drain(outbox)
    assert len(items) == 1 and isinstance(items[0], NotFound)
    with pytest.raises(ValueError):
        CaptionsOutbox(max_finals=0)


def test_the_snapshot_is_the_last_finals_then_the_partial_or_the_terminal() -> None:
    replay = ReplayState()
    for i in range(5):
        replay.record(final(i))
    replay.record(partial(7))
    assert replay.snapshot(2) == [final(3), final(4), partial(7)]
    assert replay.snapshot(0) == [partial(7)]
    assert len(replay.snapshot()) == 6  # a resume's replay: every final
    done = TranscriptFinal((), FinishReason.STOP, 0.0, 5.0)
    replay.record(done)
    assert replay.snapshot(1) == [final(4), done]


def test_renames_of_ever_new_labels_do_not_grow_a_slow_subscribers_queue_without_bound() -> None:
    """A client may send `name: null` for any label (S + up to 15 digits), named or not, and
    each is answered: a subscriber that stopped reading queued one per label, without a
    bound (and each push scanned the whole queue). Past MAX_NAMED_SPEAKERS unsent renames
    it is closed with queue_full, as for finals."""
    outbox = CaptionsOutbox(max_finals=8)
    for i in range(MAX_NAMED_SPEAKERS):
        outbox.push(SpeakerRenamed(f"S{i}", "x" if i % 2 else None))
    assert not outbox.closed  # as many labels as a session may name
    for i in range(10 * MAX_NAMED_SPEAKERS):
        outbox.push(SpeakerRenamed(f"S{1000 + i}", None))
    assert outbox.closed and len(outbox) == 1
    assert isinstance(outbox.pop(), QueueFull)


def test_merges_queue_in_order_unreplaced_and_bounded() -> None:
    """Each `speaker.merged` merges another label for good: none replaces another. A session
    makes at most MAX_MERGED_SPEAKERS, so a subscriber never has more unsent; past the
    outbox's own bound it is closed with queue_full, as for finals."""
    outbox = CaptionsOutbox(max_finals=8, max_merges=3)
    merges = [SpeakerMerged("S03", "S01"), SpeakerMerged("S04", "S01"), SpeakerMerged("S01", "S2")]
    outbox.push(merges[0])
    outbox.push(final(0))
    outbox.push(merges[1])
    outbox.push(merges[2])
    assert drain(outbox) == [merges[0], final(0), *merges[1:]]
    for i in range(4):
        outbox.push(SpeakerMerged(f"S{10 + i}", "S01"))
    assert outbox.closed and isinstance(drain(outbox)[-1], QueueFull)
    assert CaptionsOutbox(max_finals=8).max_merges == MAX_MERGED_SPEAKERS


def test_the_snapshot_replays_the_merges_right_after_the_names() -> None:
    """Those answered (`told`: the journal holds them); one recorded and still waiting for
    the journal is not replayed (its answer comes when it is held)."""
    replay = ReplayState()
    replay.record(final(0))
    for event in (SpeakerMerged("S03", "S01"), SpeakerRenamed("S01", "Alice")):
        replay.record(event)
        replay.told(event)
    replay.record(SpeakerRenamed("S02", "Bob"))  # not answered yet
    replay.record(partial(2))
    assert replay.snapshot() == [
        final(0),
        SpeakerRenamed("S01", "Alice"),
        SpeakerMerged("S03", "S01"),
        partial(2),
    ]


def said(i: int, speaker: str, seg_id: str = "") -> Segment:
    """Segment `i` spoken by `speaker`; with `seg_id`, a final."""
    return Segment(i, i + 1, speaker, f"f{i}", id=seg_id, is_final=bool(seg_id))


def test_backend_events_decoded_before_a_merge_are_shown_without_the_merged_label() -> None:
    """What the backend decoded before the merge reached it carries S03: what the client has
    not seen yet shows S01; the final transcript holds each final as it was sent (a final of
    S03 from before the merge keeps it), and it and the revision carry the merges."""
    replay = ReplayState()
    plain = SegmentPartial(1, (said(0, "S03"),))
    assert replay.as_shown(plain) is plain  # no merges: as it is
    before = SegmentFinal(said(0, "S03", "seg-0000"))
    replay.record(before)
    replay.record(SpeakerMerged("S03", "S01"))
    assert replay.as_shown(SegmentPartial(2, (said(1, "S03"),))) == SegmentPartial(
        2, (said(1, "S01"),)
    )
    late = SegmentFinal(said(1, "S03", "seg-0001"))
    shown = replay.as_shown(late)
    assert isinstance(shown, SegmentFinal) and shown.segment.speaker == "S01"
    replay.record(shown)
    done = TranscriptFinal((before.segment, late.segment), FinishReason.STOP, 1.0, 2.0)
    out = replay.as_shown(done)
    assert isinstance(out, TranscriptFinal)
    assert [s.speaker for s in out.segments] == ["S03", "S01"]  # as sent
    assert out.merged == (("S03", "S01"),)
    revised = TranscriptRevised((said(0, "S03", "rev-0001"),), ("seg-0000", "seg-0001"))
    out_revised = replay.as_shown(revised)
    assert isinstance(out_revised, TranscriptRevised)
    assert [s.speaker for s in out_revised.segments] == ["S01"]
    assert out_revised.merged == (("S03", "S01"),)
