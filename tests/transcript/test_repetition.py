"""The repetition guard on its own: segment runs, periodic tails, released vs dropped copies."""

from __future__ import annotations

import pytest

from livemeet.transcript.repetition import RepetitionGuard, RepetitionOptions, periodic_tail
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
