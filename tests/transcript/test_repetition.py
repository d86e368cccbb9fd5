"""The repetition guard on its own: segment runs, periodic tails, released vs dropped copies."""

from __future__ import annotations

import pytest

from livemeet.transcript.repetition import (
    RepetitionGuard,
    RepetitionOptions,
    cut_periodic_tail,
    periodic_tail,
)
from livemeet.transcript.segments import Segment


def seg(i: int, text: str) -> Segment:
    return Segment(float(i), float(i) + 1.0, "S01", text)


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
    guard.seed(["one", "Thank you.", "thank you"])  # two copies (normalised) at the end
    assert guard.push(seg(1, "Thank you!")).release == ()  # the third copy is held
    result = guard.push(seg(2, "Thank you."))  # the fourth trips
    assert result.looping and guard.tripped
    fresh = RepetitionGuard(RepetitionOptions(max_segment_repeats=4))
    fresh.seed(["Thank you.", "Thank you.", "one"])  # the run is not at the end
    assert [s.text for s in fresh.push(seg(3, "one")).release] == []  # held: 2nd copy of "one"
    assert not fresh.push(seg(4, "one")).looping  # 3rd
    assert fresh.push(seg(5, "one")).looping  # 4th, counting the seeded one
    other = RepetitionGuard(RepetitionOptions(max_segment_repeats=4))
    other.seed(["a", "a", "a"])
    assert [s.text for s in other.push(seg(6, "b")).release] == ["b"]
    for _ in range(2):
        assert not other.push(seg(7, "b")).looping


def test_cut_periodic_tail_keeps_one_period_at_a_word_boundary() -> None:
    """A demo trial: tiny.en wrote 670 characters of "Yeah, yeah, ..." as one segment."""
    assert cut_periodic_tail("Yeah, " + "yeah, " * 100 + "yeah") == "Yeah,"
    assert cut_periodic_tail("I said no. " + "Yeah, " * 40) == "I said no. Yeah,"
    assert cut_periodic_tail("If the reed" + "-o" * 110) == "If the reed-o"  # no space in it
    assert cut_periodic_tail("plain text " * 3) is None  # too short a span to be a loop
