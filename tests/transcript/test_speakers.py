from __future__ import annotations

from livemeet.transcript.segments import Segment
from livemeet.transcript.speakers import SpeakerMapper, overlap_s


def seg(a: float, b: float, spk: str, text: str = "x") -> Segment:
    return Segment(a, b, spk, text)


def test_overlap() -> None:
    assert overlap_s(seg(0, 2, "S01"), seg(1, 3, "S02")) == 1
    assert overlap_s(seg(0, 1, "S01"), seg(1, 3, "S02")) == 0


def test_first_hypothesis_gets_labels_in_order() -> None:
    m = SpeakerMapper()
    out = m.map([seg(0, 1, "S07"), seg(1, 2, "S03")], [])
    assert [s.speaker for s in out] == ["S01", "S02"]


def test_renumbered_hypothesis_maps_back_by_overlap() -> None:
    m = SpeakerMapper()
    seen = m.map([seg(0, 2, "S01"), seg(2, 4, "S02")], [])
    # the next decode context swapped the numbers and heard a third speaker
    out = m.map([seg(0, 2, "S02"), seg(2, 4.5, "S01"), seg(4.5, 5, "S03")], seen)
    assert [s.speaker for s in out] == ["S01", "S02", "S03"]


def test_seen_label_is_never_reused_for_a_new_speaker() -> None:
    m = SpeakerMapper()
    m.map([seg(0, 1, "S01"), seg(1, 2, "S02")], [])
    # S02's segment vanished; a new speaker without evidence must not take a seen label
    out = m.map([seg(0, 1, "S01"), seg(3, 4, "S09")], [seg(0, 1, "S01")])
    assert [s.speaker for s in out] == ["S01", "S03"]


def test_no_evidence_keeps_previous_mapping() -> None:
    m = SpeakerMapper()
    m.map([seg(0, 1, "S01")], [])
    out = m.map([seg(5, 6, "S01")], [])
    assert out[0].speaker == "S01"


def test_two_hypothesis_labels_never_share_a_session_label() -> None:
    m = SpeakerMapper()
    seen = m.map([seg(0, 4, "S01")], [])
    out = m.map([seg(0, 2, "S01"), seg(2, 4, "S02")], seen)
    assert len({s.speaker for s in out}) == 2


def test_a_restored_mapper_keeps_the_stored_labels_and_gives_a_newcomer_a_fresh_one() -> None:
    """Restored from a session's stored finals (a restart, DESIGN 5.9): a returning speaker
    the decode writes with its stored label keeps it with no overlap to go on, and a speaker
    heard for the first time gets a label no stored final has. A fresh mapper gave the
    returning speaker S01 of the demo (every segment S01) the label S02."""
    stored = [seg(0, 2, "S01"), seg(2, 4, "S02"), seg(4, 5, "S01")]
    m = SpeakerMapper(restored=stored)
    assert m.seen == {"S01", "S02"}
    out = m.map([seg(6, 7, "S02"), seg(7, 8, "S01"), seg(8, 9, "S03")], stored)
    assert [s.speaker for s in out] == ["S02", "S01", "S03"]
    newcomer = SpeakerMapper(restored=[seg(0, 2, "S02")]).map([seg(3, 4, "S01")], [])
    assert [s.speaker for s in newcomer] == ["S01"]  # S02 is taken; S01 was never handed out
    demo = SpeakerMapper(restored=[seg(0, 2, "S01")])
    assert [s.speaker for s in demo.map([seg(3, 4, "S01")], [])] == ["S01"]
