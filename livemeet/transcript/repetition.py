"""Repetition guard: detects greedy-decoding loops in a parsed MOSS-TD stream.

Greedy decoding can loop on non-speech audio (MODEL.md section 5.5). Two shapes are caught:
- a run of consecutive segments with the same normalised text (the model keeps writing
  `[t][S01]Thank you.[t']` with new times): `max_segment_repeats` copies by one speaker, or
  `max_mixed_repeats` copies where the speaker changes within the run (people answer each
  other "Yeah." in turn; a loop across speakers is rarer and runs on);
- a segment whose text ends in a span of at least `min_span_chars` characters that repeats
  with a period of at most `max_period_chars` characters ("the the the ...", "哈哈哈...").

The guard holds back each segment that repeats its predecessor's text until the run either
breaks (the held copies are real and released) or reaches the limit (a loop: the copies beyond
the first are dropped). Plain Python: no I/O, no tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from livemeet.audio.constants import (
    REPETITION_MAX_MIXED_REPEATS,
    REPETITION_MAX_PERIOD_CHARS,
    REPETITION_MAX_SEGMENT_REPEATS,
    REPETITION_MIN_SPAN_CHARS,
)
from livemeet.transcript.commit import normalise_text
from livemeet.transcript.segments import Segment


@dataclass(frozen=True)
class RepetitionOptions:
    """Thresholds (units in the names; defaults in livemeet/audio/constants.py)."""

    max_segment_repeats: int = REPETITION_MAX_SEGMENT_REPEATS
    max_mixed_repeats: int = REPETITION_MAX_MIXED_REPEATS
    min_span_chars: int = REPETITION_MIN_SPAN_CHARS
    max_period_chars: int = REPETITION_MAX_PERIOD_CHARS

    def __post_init__(self) -> None:
        if (
            self.max_segment_repeats < 2
            or self.max_mixed_repeats < self.max_segment_repeats
            or self.min_span_chars < 2
            or self.max_period_chars < 1
        ):
            raise ValueError(f"repetition thresholds out of range: {self}")


class _Run(NamedTuple):
    """A run of consecutive segments with one normalised text `norm`: `total` copies, the last
    `same` of them by `speaker` (the last copy's)."""

    norm: str | None = None
    speaker: str = ""
    total: int = 0
    same: int = 0

    def after(self, speaker: str) -> _Run:
        """The run with one more copy, by `speaker`, at its end."""
        same = self.same + 1 if speaker == self.speaker else 1
        return _Run(self.norm, speaker, self.total + 1, same)

    def before(self, norm: str, speaker: str) -> _Run:
        """The run with one more copy at its start (`seed` walks the history backwards); the
        trailing same-speaker count grows only while that copy is by the last copy's
        speaker and the run has not changed speaker yet."""
        if self.norm is None:
            return _Run(norm, speaker, 1, 1)
        same = self.same + 1 if speaker == self.speaker and self.same == self.total else self.same
        return _Run(norm, self.speaker, self.total + 1, same)


class GuardResult(NamedTuple):
    """`release`: segments safe to emit now, in order. `looping`: a loop was detected; stop
    decoding (the repeated copies have been dropped)."""

    release: tuple[Segment, ...]
    looping: bool


def periodic_tail(text: str, min_span: int, max_period: int) -> int | None:
    """The smallest period p <= `max_period` such that the last `min_span` characters of `text`
    each equal the character p before them, or None. Cost O(max_period x min_span)."""
    for p in range(1, max_period + 1):
        if len(text) < min_span + p:
            return None
        if text[-min_span:] == text[-min_span - p : -p]:
            return p
    return None


def cut_periodic_tail(text: str, options: RepetitionOptions | None = None) -> str | None:
    """`text` cut after the first copy of its periodic tail (`periodic_tail` with `options`'
    thresholds), or None when its tail is not periodic: a runaway segment ("Yeah, yeah, ..."
    for 26 s) keeps what came before the loop plus one period, cut at the last space in that
    period when it holds one (a period may start mid-word: "eah, y" of "Yeah, yeah, ...")."""
    o = options or RepetitionOptions()
    period = periodic_tail(text, o.min_span_chars, o.max_period_chars)
    if period is None:
        return None
    start = len(text) - o.min_span_chars - period  # text[i] == text[i + period] from here on
    while start > 0 and text[start - 1] == text[start - 1 + period]:
        start -= 1
    stop = start + period
    space = text.rfind(" ", start + 1, stop + 1)
    return text[: space if space > 0 else stop].rstrip()


def find_segment_loop(segments: Sequence[Segment], min_repeats: int) -> int | None:
    """The index of the first segment of the first run of at least `min_repeats` consecutive
    `segments` with one non-empty normalised text, whoever speaks them, or None. A window
    re-decoder's loop ("I don't know." as 27 one-second segments over 29 s of a 30-s window)
    spans segments, where `cut_periodic_tail` and a decoder's n-gram ban, both within one
    segment's text, do not see it."""
    assert min_repeats >= 2, min_repeats
    run_start, run_norm = 0, ""
    for i, seg in enumerate(segments):
        norm = normalise_text(seg.text)
        if not norm or norm != run_norm:
            run_start, run_norm = i, norm
        elif i - run_start + 1 >= min_repeats:
            return run_start
    return None


class RepetitionGuard:
    """Feed confirmed segments with `push`, the text of the segment being written with
    `check_pending`; `flush` at a normal end releases held segments. Once a loop is seen the
    guard is tripped: `push` releases nothing more."""

    def __init__(self, options: RepetitionOptions | None = None) -> None:
        self.options = options or RepetitionOptions()
        self._run = _Run()  # the trailing run of one text, its emitted copies included
        self._held: list[Segment] = []
        self.tripped = False

    def seed(self, history: Sequence[Segment]) -> None:
        """Segments emitted before this decode (a forced transcript prefix), oldest first: the
        copies in their trailing run of one text count toward the loop limits, so a loop that
        crosses the prefix is still seen."""
        run = _Run()
        for seg in reversed(history):
            norm = normalise_text(seg.text)
            if not norm or (run.norm is not None and norm != run.norm):
                break
            run = run.before(norm, seg.speaker)
        self._run = run

    def push(self, segment: Segment) -> GuardResult:
        """A newly confirmed segment."""
        if self.tripped:
            return GuardResult((), True)
        norm = normalise_text(segment.text)
        if norm and norm == self._run.norm:
            self._run = self._run.after(segment.speaker)
            self._held.append(segment)
            o = self.options
            if self._run.same >= o.max_segment_repeats or self._run.total >= o.max_mixed_repeats:
                self._held.clear()
                self.tripped = True
                return GuardResult((), True)
            return GuardResult((), False)
        released = (*self._held, segment)
        self._held.clear()
        self._run = _Run(norm, segment.speaker, 1, 1) if norm else _Run()
        return GuardResult(released, False)

    def check_pending(self, text: str) -> bool:
        """True (and tripped) when the text of the open segment ends in a periodic span."""
        if self.tripped:
            return True
        o = self.options
        if periodic_tail(text, o.min_span_chars, o.max_period_chars) is not None:
            self._held.clear()
            self.tripped = True
        return self.tripped

    def flush(self) -> tuple[Segment, ...]:
        """End of a decode that did not loop: the held repeats were real."""
        if self.tripped:
            return ()
        out = tuple(self._held)
        self._held.clear()
        return out
