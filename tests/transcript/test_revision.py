"""A revision's segments (DESIGN 5.7): labels mapped onto the session's by overlap with its
finals, fresh ids."""

from __future__ import annotations

from livemeet.transcript.commit import revision_segments
from livemeet.transcript.segments import Segment
from livemeet.transcript.speakers import map_revision

FINALS = (
    Segment(0.0, 4.0, "S01", "a", "seg-0001", True),
    Segment(4.0, 8.0, "S02", "b", "seg-0002", True),
    Segment(8.0, 10.0, "S01", "c", "seg-0003", True),
)


def test_revised_labels_follow_the_finals_by_overlap() -> None:
    revised = [
        Segment(0.0, 3.5, "S02", "a"),  # the re-decode numbered speakers the other way round
        Segment(3.5, 8.2, "S01", "b"),
        Segment(8.2, 10.0, "S02", "c"),
    ]
    assert [s.speaker for s in map_revision(revised, FINALS)] == ["S01", "S02", "S01"]


def test_a_speaker_the_session_never_had_gets_a_label_never_used() -> None:
    revised = [
        Segment(0.0, 4.0, "S01", "a"),
        Segment(4.0, 8.0, "S02", "b"),
        Segment(10.5, 12.0, "S03", "d"),  # no final overlaps it
    ]
    # S03 was shown once in a partial: taken, so the newcomer is S04
    mapped = map_revision(revised, FINALS, used={"S01", "S02", "S03"})
    assert [s.speaker for s in mapped] == ["S01", "S02", "S04"]
    assert [s.speaker for s in map_revision(revised, FINALS)] == ["S01", "S02", "S03"]


def test_two_revised_speakers_never_share_a_session_label() -> None:
    revised = [Segment(0.0, 2.0, "S01", "a"), Segment(2.0, 4.0, "S02", "a2")]  # inside S01
    assert [s.speaker for s in map_revision(revised, FINALS)] == ["S01", "S03"]


def test_revision_ids_are_fresh_and_final() -> None:
    finals = (*FINALS, Segment(10.0, 11.0, "S01", "odd", "rev-0002", True))
    out = revision_segments([Segment(0, 1, "S01", "x"), Segment(1, 2, "S02", "y")], finals)
    assert [s.id for s in out] == ["rev-0001", "rev-0003"]
    assert all(s.is_final for s in out)
