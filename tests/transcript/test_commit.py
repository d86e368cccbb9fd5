from __future__ import annotations

from dataclasses import replace

import pytest

from livemeet.transcript.commit import (
    CommitBuffer,
    CommitOptions,
    agreed_prefix,
    next_final_number,
    normalise_text,
    segments_agree,
)
from livemeet.transcript.segments import Segment

OPTS = CommitOptions(horizon_s=1.0, time_tolerance_s=0.5)


def seg(a: float, b: float, text: str, spk: str = "S01") -> Segment:
    return Segment(a, b, spk, text)


def test_normalise_ignores_case_and_punctuation() -> None:
    assert normalise_text("Hello,  World!") == normalise_text("hello world")
    assert normalise_text("Hello") != normalise_text("Hallo")


def test_agreement_needs_speaker_text_and_times() -> None:
    a = seg(0, 2, "hi there")
    assert segments_agree(a, seg(0.3, 2.4, "Hi there."), 0.5)
    assert not segments_agree(a, seg(0, 2, "hi there", "S02"), 0.5)
    assert not segments_agree(a, seg(0, 2, "hi where"), 0.5)
    assert not segments_agree(a, seg(0.6, 2, "hi there"), 0.5)
    assert not segments_agree(a, seg(0, 2.6, "hi there"), 0.5)


def test_prefix_stops_at_horizon_and_disagreement() -> None:
    prev = [seg(0, 2, "a"), seg(2, 4, "b"), seg(4, 6, "c")]
    cur = [seg(0, 2, "a"), seg(2, 4, "b"), seg(4, 6, "c")]
    assert agreed_prefix(prev, cur, edge_s=7.0, options=OPTS) == 3
    assert agreed_prefix(prev, cur, edge_s=6.5, options=OPTS) == 2  # c ends inside the horizon
    cur[1] = seg(2, 4, "bee")
    assert agreed_prefix(prev, cur, edge_s=7.0, options=OPTS) == 1
    assert agreed_prefix([], cur, edge_s=7.0, options=OPTS) == 0


def test_buffer_commits_on_second_agreement_with_stable_ids() -> None:
    buf = CommitBuffer(OPTS)
    first = buf.update([seg(0, 2, "a"), seg(2, 3, "b")], edge_s=5.0)
    assert first.finals == () and len(first.tail) == 2
    second = buf.update([seg(0, 2, "A."), seg(2, 3.2, "b c")], edge_s=6.0)
    assert [s.id for s in second.finals] == ["seg-0001"]
    assert second.finals[0].is_final and second.finals[0].text == "A."
    assert [s.text for s in second.tail] == ["b c"] and second.tail[0].id == ""
    # the committed segment is never re-emitted; the tail keeps agreeing from where it stands
    third = buf.update([seg(2, 3.2, "b c")], edge_s=7.0)
    assert [s.id for s in third.finals] == ["seg-0002"]
    assert [s.id for s in buf.committed] == ["seg-0001", "seg-0002"]
    assert buf.committed_end_s == 3.2


def test_force_commit_commits_the_tail() -> None:
    buf = CommitBuffer(OPTS)
    buf.update([seg(0, 2, "a"), seg(2, 3, "b"), seg(3, 4, "c")], edge_s=4.0)
    part = buf.force_commit(2)
    assert [s.text for s in part.finals] == ["a", "b"] and [s.text for s in part.tail] == ["c"]
    rest = buf.force_commit()
    assert [s.id for s in rest.finals] == ["seg-0003"] and rest.tail == ()
    assert buf.force_commit().finals == ()


def test_force_commit_commits_an_amended_tail() -> None:
    buf = CommitBuffer(OPTS)
    buf.update([seg(0, 4, "a")], edge_s=4.0)
    amended = [seg(0, 2.5, "a"), seg(2.5, 3.5, "b")]  # a session's cut (session/live.py)
    done = buf.force_commit(tail=amended)
    assert [(s.id, s.end_s, s.text) for s in done.finals] == [
        ("seg-0001", 2.5, "a"),
        ("seg-0002", 3.5, "b"),
    ]
    assert done.tail == () and buf.committed_end_s == 3.5


def test_committed_starts_never_decrease() -> None:
    buf = CommitBuffer(OPTS)
    buf.update([seg(5, 6, "a")], edge_s=6.0)
    buf.force_commit()
    buf.update([seg(4, 7, "b")], edge_s=7.0)
    buf.force_commit()
    starts = [s.start_s for s in buf.committed]
    assert starts == sorted(starts)


def test_a_final_keeps_the_times_of_the_partial_it_confirms() -> None:
    """`livemeet stream jfk.flac --fast` (demo): the partial read 0.00-7.54 and 7.54-9.00, the
    next decode 0.00-8.00 and 8.00-11.00 (agreeing within the tolerance), and the final took
    8.00, which neither the partial nor the upload (7.54) said."""
    buf = CommitBuffer(OPTS)
    buf.update([seg(0, 7.54, "ask not"), seg(7.54, 9.0, "ask what")], edge_s=9.0)
    update = buf.update([seg(0, 8.0, "Ask not."), seg(8.0, 11.0, "ask what you")], edge_s=11.0)
    assert [(s.start_s, s.end_s, s.text) for s in update.finals] == [(0, 7.54, "Ask not.")]
    assert [(s.start_s, s.end_s) for s in update.tail] == [(8.0, 11.0)]


def test_a_partial_that_ran_into_its_edge_commits_with_the_later_times() -> None:
    """A partial ending at its decode's audio edge (0-8.00 at 8.00: speech went on past it)
    has no end of its own: the later decode's end (7.54) is the model's. A partial ending after
    the later decode's end keeps the later times too: its end would be the committed end, past
    the start of the later decode's next segment (a review: 7.5-7.9 of "ask what" was then left
    out of every later decode window)."""
    buf = CommitBuffer(OPTS)
    buf.update([seg(0, 8.0, "ask not")], edge_s=8.0)
    update = buf.update([seg(0, 7.54, "ask not"), seg(7.54, 9.0, "ask what")], edge_s=9.0)
    assert [(s.start_s, s.end_s) for s in update.finals] == [(0, 7.54)]
    buf = CommitBuffer(OPTS)
    buf.update([seg(0, 7.9, "ask not"), seg(7.9, 8.5, "ask")], edge_s=9.0)
    update = buf.update([seg(0, 7.5, "ask not"), seg(7.5, 9.5, "ask what")], edge_s=10.0)
    assert [(s.start_s, s.end_s) for s in update.finals] == [(0, 7.5)]
    assert [(s.start_s, s.end_s) for s in update.tail] == [(7.5, 9.5)]
    assert buf.committed_end_s == 7.5


def final(a: float, b: float, text: str, segment_id: str) -> Segment:
    return replace(seg(a, b, text), id=segment_id, is_final=True)


def test_a_buffer_restored_from_finals_goes_on_after_them() -> None:
    """A restarted session's stored finals (DESIGN 5.9) are the buffer's committed transcript:
    none comes out again, and the next ids follow theirs."""
    stored = (final(0, 2, "a", "seg-0001"), final(2, 3, "b", "seg-0002"))
    buf = CommitBuffer(OPTS, restored=stored)
    assert buf.committed == stored and buf.committed_end_s == 3.0 and buf.tail == ()
    buf.update([seg(3, 4, "c")], edge_s=6.0)
    update = buf.update([seg(3, 4, "c"), seg(4, 5.5, "d")], edge_s=7.0)
    assert [(s.id, s.text) for s in update.finals] == [("seg-0003", "c")]
    assert [s.id for s in buf.force_commit().finals] == ["seg-0004"]
    assert buf.committed[:2] == stored


def test_new_ids_never_equal_a_restored_one() -> None:
    assert next_final_number([]) == 1
    assert next_final_number([final(0, 1, "a", "x"), final(1, 2, "b", "y")]) == 3
    assert next_final_number([final(0, 1, "a", "seg-0007"), final(1, 2, "b", "x")]) == 8
    buf = CommitBuffer(OPTS, restored=[final(0, 1, "a", "seg-0002"), final(1, 2, "b", "seg-0001")])
    buf.update([seg(2, 3, "c")], edge_s=5.0)
    assert [s.id for s in buf.force_commit().finals] == ["seg-0003"]


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ([seg(0, 1, "a")], "not a final with an id"),
        ([replace(seg(0, 1, "a"), is_final=True)], "not a final with an id"),
        ([final(0, 1, "a", "seg-0001"), final(1, 2, "b", "seg-0001")], "repeats the id"),
        ([final(2, 1, "a", "seg-0001")], "start_s <= end_s"),
        ([final(-1, 1, "a", "seg-0001")], "start_s <= end_s"),
        ([final(1, 2, "a", "seg-0001"), final(0.5, 3, "b", "seg-0002")], "before the one ahead"),
    ],
)
def test_restored_finals_are_checked(stored: list[Segment], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CommitBuffer(OPTS, restored=stored)
