"""Client-requested speaker merges (livemeet/transcript/speakers.py, DESIGN 5.6): the merge map,
its checks, and the mapper and the revision writing a merged label's target from then on."""

from __future__ import annotations

import pytest

from livemeet.transcript.segments import Segment
from livemeet.transcript.speakers import SpeakerMapper, SpeakerMerges, map_revision

SHOWN = {"S01", "S02", "S03", "S04"}


def seg(a: float, b: float, spk: str, text: str = "x") -> Segment:
    return Segment(a, b, spk, text)


def labels(segments: tuple[Segment, ...]) -> list[str]:
    return [s.speaker for s in segments]


def test_a_merge_into_a_merged_away_label_goes_to_its_final_target() -> None:
    """S04 into S03 after S03 into S01: S04 shows as S01, and is recorded so (one look-up)."""
    merges = SpeakerMerges()
    merges.add("S03", merges.check("S03", "S01", SHOWN))
    assert merges.check("S04", "S03", SHOWN) == "S01"
    merges.add("S04", "S03")
    assert merges.items() == (("S03", "S01"), ("S04", "S01"))
    assert [merges.resolve(x) for x in ("S01", "S02", "S03", "S04")] == ["S01", "S02"] + ["S01"] * 2


def test_a_chain_formed_by_merging_a_target_away_later_resolves_transitively() -> None:
    merges = SpeakerMerges([("S04", "S03"), ("S03", "S01")])
    assert merges.items() == (("S04", "S03"), ("S03", "S01"))  # as made
    assert merges.resolve("S04") == "S01"
    assert merges.resolved() == (("S04", "S01"), ("S03", "S01"))
    assert merges.slots("S03") == ["S01", "S04", "S03"]  # resolved first: S01's group


@pytest.mark.parametrize(
    ("made", "speaker", "into", "why"),
    [
        ((), "S01", "S01", "into itself"),
        ((("S03", "S01"),), "S03", "S02", "merged into S01 already"),
        ((("S03", "S01"),), "S03", "S01", "merged into S01 already"),  # a repeat too
        ((), "S09", "S01", "S09 is not a label this session has shown"),
        ((), "S01", "S09", "S09 is not a label"),
        ((("S03", "S01"),), "S01", "S03", "cycle"),
        ((("S04", "S03"), ("S03", "S01")), "S01", "S04", "cycle"),  # through the chain
    ],
)
def test_a_merge_the_session_cannot_make_says_why(
    made: tuple[tuple[str, str], ...], speaker: str, into: str, why: str
) -> None:
    merges = SpeakerMerges(made)
    with pytest.raises(ValueError, match=why):
        merges.check(speaker, into, SHOWN)
    assert merges.items() == made


def test_merges_are_bounded_and_a_merged_label_counts_as_shown() -> None:
    merges = SpeakerMerges([("S03", "S01")])
    with pytest.raises(ValueError, match="at most 1 labels"):
        merges.check("S04", "S01", SHOWN, limit=1)
    # restored merges name labels only a partial showed before a restart: still mergeable
    assert merges.check("S01", "S02", {"S02"}) == "S02"


def test_add_ignores_a_repeat_and_refuses_a_conflict_or_a_cycle() -> None:
    merges = SpeakerMerges([("S03", "S01")])
    merges.add("S03", "S01")  # a rebuilt session restored with it, then sent it again
    with pytest.raises(ValueError):
        merges.add("S03", "S02")
    with pytest.raises(ValueError, match="cycle"):
        merges.add("S01", "S03")
    with pytest.raises(ValueError, match="cycle"):
        SpeakerMerges([("S03", "S01"), ("S01", "S03")])
    assert merges.items() == (("S03", "S01"),)


def test_after_a_merge_the_mapper_writes_the_target_and_counts_the_merged_labels_speech() -> None:
    m = SpeakerMapper()
    seen = m.map([seg(0, 2, "S01"), seg(2, 4, "S02"), seg(4, 6, "S03")], [])
    m.merge("S03", "S01")
    # the next decode renumbers: its S07 overlaps the S03 speech the client saw
    out = m.map([seg(0, 2, "S05"), seg(2, 4, "S06"), seg(4, 6, "S07")], seen)
    assert labels(out) == ["S01", "S02", "S01"]
    # no evidence: remembered as S03's, written as S01
    assert labels(m.map([seg(9, 10, "S07")], [])) == ["S01"]


def test_both_speakers_the_model_keeps_apart_map_onto_the_merged_label() -> None:
    """The model goes on hearing two voices where the client said one person speaks: each
    takes a slot of S01's group, so neither is pushed onto a fresh label (which the client
    would have to merge again); a third voice is a new speaker, with a label never shown."""
    m = SpeakerMapper()
    seen = m.map([seg(0, 2, "S01"), seg(2, 4, "S02"), seg(4, 6, "S03")], [])
    m.merge("S03", "S01")
    out = m.map([seg(0, 2, "S01"), seg(2, 4, "S02"), seg(4, 6, "S03"), seg(7, 8, "S04")], seen)
    assert labels(out) == ["S01", "S02", "S01", "S04"]
    # the client now sees S01 where S03 spoke; a decode that numbers them afresh still fits
    again = m.map([seg(0, 2, "S02"), seg(2, 4, "S03"), seg(4, 6, "S01")], out)
    assert labels(again) == ["S01", "S02", "S01"]


def test_a_chain_of_merges_maps_every_merged_labels_speaker_to_the_last_target() -> None:
    m = SpeakerMapper()
    seen = m.map([seg(0, 2, "S01"), seg(2, 4, "S02"), seg(4, 6, "S03"), seg(6, 8, "S04")], [])
    m.merge("S03", "S01")
    m.merge("S04", "S03")
    assert m.merges == (("S03", "S01"), ("S04", "S01"))
    out = m.map([seg(4, 6, "S02"), seg(6, 8, "S01")], seen)
    assert labels(out) == ["S01", "S01"]


def test_a_merged_label_is_never_handed_out_again() -> None:
    """S02 was merged away (it was only ever in a partial, and the decode dropped it): a new
    speaker gets S03, not S02 (which the client shows as S01)."""
    m = SpeakerMapper()
    m.map([seg(0, 1, "S01"), seg(1, 2, "S02")], [])
    m.merge("S02", "S01")
    assert labels(m.map([seg(0, 1, "S01"), seg(5, 6, "S09")], [seg(0, 1, "S01")])) == [
        "S01",
        "S03",
    ]
    # a mapper restored after a restart knows the merged labels as handed out too
    restored = SpeakerMapper(restored=[seg(0, 2, "S01")], merges=[("S02", "S01")])
    assert restored.seen == {"S01", "S02"}
    assert labels(restored.map([seg(5, 6, "S09")], [])) == ["S03"]


def test_forced_prefix_labels_of_a_merged_away_label_write_its_target() -> None:
    """A forced transcript holds finals labelled S03 from before the merge (finals keep their
    labels): a decode that writes S03 on from there writes S01's speaker."""
    m = SpeakerMapper(merges=[("S03", "S01")])
    out = m.map([seg(0, 1, "S01"), seg(1, 2, "S03"), seg(2, 3, "S02")], [], {"S01", "S03"})
    assert labels(out) == ["S01", "S01", "S02"]


def test_a_revision_maps_onto_merged_labels_targets_and_never_writes_a_merged_label() -> None:
    finals = [seg(0, 2, "S01"), seg(2, 4, "S02"), seg(4, 6, "S03")]
    revised = [seg(0, 2, "S01"), seg(2, 4, "S02"), seg(4, 6, "S03"), seg(7, 8, "S04")]
    out = map_revision(revised, finals, {"S01", "S02", "S03"}, [("S03", "S01"), ("S04", "S02")])
    # S04 (merged away, only ever in a partial) is not the new speaker's either
    assert labels(out) == ["S01", "S02", "S01", "S05"]
    plain = map_revision(revised, finals, {"S01", "S02", "S03"})
    assert labels(plain) == ["S01", "S02", "S03", "S04"]


def test_a_restored_merged_label_seen_only_in_partials_maps_to_its_target() -> None:
    """After a restart the mapper knows the finals and the merges, not the partials: S04,
    merged into S02, had only been in partials. The backend writes that speaker as S04 again
    (a returning speaker keeps the label its decodes gave it): it shows as S02, not as a
    fresh S05 (a trial)."""
    finals = [Segment(0.0, 3.0, "S01", "a"), Segment(3.0, 6.0, "S02", "b")]
    mapper = SpeakerMapper(restored=finals, merges=[("S04", "S02")])
    [seg] = mapper.map([Segment(13.0, 14.0, "S04", "I can")], seen=[])
    assert seg.speaker == "S02"
    # a speaker the session never had still gets a fresh label, none merged away
    [new] = mapper.map([Segment(15.0, 16.0, "S05", "hi")], seen=[])
    assert new.speaker == "S03"
