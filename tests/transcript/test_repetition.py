"""The repetition guard on its own: segment runs, periodic tails, released vs dropped copies."""

from __future__ import annotations

import pytest

from livemeet.transcript.repetition import (
    RepetitionGuard,
    RepetitionOptions,
    cut_periodic_tail,
    find_segment_loop,
    periodic_tail,
)
from livemeet.transcript.segments import Segment


def seg(i: int, text: str, speaker: str = "S01") -> Segment:
    return Segment(float(i), float(i) + 1.0, speaker, text)


def history(*texts: str) -> list[Segment]:
    return [seg(i, t) for i, t in enumerate(texts)]


def test_run_of_same_text_trips_and_keeps_only_the_first_copy() -> None:
    guard = RepetitionGuard(RepetitionOptions(max_segment_repeats=4))
    released: list[Segment] = []
    results = []
    for i, text in enumerate(["Hello.", "Thank you.", "thank you", "Thank you!", "Thank you."]):
        r = guard.push(seg(i, text))
        released.extend(r.release)
        results.append(r.looping)
    assert results == [False, False, False, False, True]
    assert [s.text for s in released] == ["Hello.", "Thank you."]
    assert guard.tripped and guard.flush() == ()
    assert guard.push(seg(9, "new")).release == ()


def test_short_runs_are_released_when_the_run_breaks_or_at_flush() -> None:
    guard = RepetitionGuard(RepetitionOptions(max_segment_repeats=4))
    out: list[Segment] = []
    for i, text in enumerate(["yeah", "yeah", "yeah", "so"]):
        r = guard.push(seg(i, text))
        assert not r.looping
        out.extend(r.release)
    assert [s.text for s in out] == ["yeah", "yeah", "yeah", "so"]
    guard.push(seg(5, "so"))
    assert [s.text for s in guard.flush()] == ["so"]


def test_periodic_tail() -> None:
    assert periodic_tail("intro " + "ha" * 100, 120, 24) == 2
    assert periodic_tail("x" * 200, 120, 24) == 1
    assert periodic_tail("abc " * 10, 120, 24) is None  # too short a span
    words = " ".join(f"w{i}" for i in range(200))
    assert periodic_tail(words, 120, 24) is None
    assert periodic_tail("the cat " * 30, 120, 24) == 8


def test_pending_text_loop_trips() -> None:
    guard = RepetitionGuard()
    assert not guard.check_pending("a normal sentence that goes on for a while")
    assert guard.check_pending("a normal sentence " + "的的" * 100)
    assert guard.tripped


def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        RepetitionOptions(max_segment_repeats=1)


def test_a_seeded_run_counts_toward_the_limit() -> None:
    """A forced transcript prefix that ends in copies of one text: the decode's copies add to
    them (a loop that crosses the prefix), while other history or other text changes nothing."""
    guard = RepetitionGuard(RepetitionOptions(max_segment_repeats=4))
    guard.seed(history("one", "Thank you.", "thank you"))  # two copies (normalised) at the end
    assert guard.push(seg(1, "Thank you!")).release == ()  # the third copy is held
    result = guard.push(seg(2, "Thank you."))  # the fourth trips
    assert result.looping and guard.tripped
    fresh = RepetitionGuard(RepetitionOptions(max_segment_repeats=4))
    fresh.seed(history("Thank you.", "Thank you.", "one"))  # the run is not at the end
    assert [s.text for s in fresh.push(seg(3, "one")).release] == []  # held: 2nd copy of "one"
    assert not fresh.push(seg(4, "one")).looping  # 3rd
    assert fresh.push(seg(5, "one")).looping  # 4th, counting the seeded one
    other = RepetitionGuard(RepetitionOptions(max_segment_repeats=4))
    other.seed(history("a", "a", "a"))
    assert [s.text for s in other.push(seg(6, "b")).release] == ["b"]
    for _ in range(2):
        assert not other.push(seg(7, "b")).looping


def test_cut_periodic_tail_keeps_one_period_at_a_word_boundary() -> None:
    """A demo trial: tiny.en wrote 670 characters of "Yeah, yeah, ..." as one segment."""
    assert cut_periodic_tail("Yeah, " + "yeah, " * 100 + "yeah") == "Yeah,"
    assert cut_periodic_tail("I said no. " + "Yeah, " * 40) == "I said no. Yeah,"
    assert cut_periodic_tail("If the reed" + "-o" * 110) == "If the reed-o"  # no space in it
    assert cut_periodic_tail("plain text " * 3) is None  # too short a span to be a loop


def test_replies_that_change_speaker_are_not_a_loop() -> None:
    """Four "Yeah." turns in a row by two speakers tripped the guard, and the upload stopped
    there: 4.9 s of a 138-s file (a trial). A run whose speaker changes is a loop only at
    max_mixed_repeats; one speaker's run still trips at max_segment_repeats."""
    options = RepetitionOptions(max_segment_repeats=4, max_mixed_repeats=12)
    guard = RepetitionGuard(options)
    out: list[Segment] = []
    for i in range(11):
        result = guard.push(seg(i, "Yeah.", "S02" if i % 2 else "S01"))
        assert not result.looping
        out.extend(result.release)
    out.extend(guard.push(seg(11, "So, the budget.")).release)
    assert [s.text for s in out] == ["Yeah."] * 11 + ["So, the budget."]
    assert guard.push(seg(12, "Yeah.", "S02")).release  # a new run
    looping = RepetitionGuard(options)
    for i in range(11):
        assert not looping.push(seg(i, "Thank you.", "S02" if i % 2 else "S01")).looping
    assert looping.push(seg(11, "Thank you.", "S02")).looping  # the 12th copy
    tail = RepetitionGuard(options)  # a mixed run that ends in one speaker's loop
    for i, speaker in enumerate(["S01", "S02", "S01", "S01", "S01"]):
        assert not tail.push(seg(i, "ok", speaker)).looping
    assert tail.push(seg(5, "ok", "S01")).looping  # S01's 4th in a row


def test_a_seeded_run_keeps_its_speakers() -> None:
    options = RepetitionOptions(max_segment_repeats=4, max_mixed_repeats=12)
    mixed = RepetitionGuard(options)
    mixed.seed([seg(0, "Yeah.", "S01"), seg(1, "Yeah.", "S02"), seg(2, "Yeah.", "S01")])
    assert not mixed.push(seg(3, "Yeah.", "S02")).looping  # 4 copies, two speakers
    same = RepetitionGuard(options)
    same.seed([seg(0, "Yeah.", "S02"), seg(1, "Yeah.", "S01"), seg(2, "Yeah.", "S01")])
    assert not same.push(seg(3, "Yeah.", "S01")).looping  # S01's 3rd in a row
    assert same.push(seg(4, "Yeah.", "S01")).looping  # S01's 4th


def test_find_segment_loop_finds_the_first_run_long_enough() -> None:
    texts = ["Hi.", "Yeah.", "yeah", "Yeah!", "So.", "I don't know."] + ["I don't know."] * 4
    assert find_segment_loop(history(*texts), 4) == 5
    assert find_segment_loop(history(*texts), 3) == 1  # "Yeah." x3, case and punctuation aside
    assert find_segment_loop(history(*texts), 6) is None
    # speakers do not break a run; empty texts are never one
    mixed = [seg(i, "Okay.", f"S0{i % 2 + 1}") for i in range(4)]
    assert find_segment_loop(mixed, 4) == 0
    assert find_segment_loop(history("", "", "", ""), 2) is None
    assert find_segment_loop([], 2) is None
