"""Segment-level commit policy for live transcription (DESIGN.md section 5.5).

A live backend re-decodes the open window every hop and returns a hypothesis: a list of
segments in session labels. A segment becomes final when two consecutive hypotheses agree on it
(LocalAgreement-2, the policy of whisper_streaming, applied to whole segments because MOSS-TD
has no word times) and it ends at least `horizon_s` behind the audio edge. Finals are
immutable, numbered "seg-0001", "seg-0002", ... and never re-emitted; the rest of the latest
hypothesis is the open tail, sent as a full-replacement partial. A buffer may start from a
session's stored finals (a restarted server, DESIGN 5.9): they are its committed transcript, and
its numbering goes on after them.

A final carries the times of the partial segment it confirms (the earlier of the two
hypotheses), with the later one's text, where the shown segment ends no later than the later
one: two decodes agree on a segment whose times moved by up to `time_tolerance_s`, and the
client was shown the earlier times. Taking the later times turned a JFK partial 0.00-7.54 into
a final 0.00-8.00 (the upload says 7.54). The later times are kept where the shown segment
ends later (the committed end, where the next decode window starts, must not pass audio the
later decode gave to the next segment) or at its decode's audio edge (speech ran into the
edge there: that end is the edge's, not one the model wrote). So a final ends at the earlier
of the two ends, and the next segment of either hypothesis starts no earlier.

Plain Python: no I/O, no clock; times are audio seconds passed in by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from livemeet.audio.constants import (
    COMMIT_HORIZON_S,
    COMMIT_TIME_TOLERANCE_S,
    STAMP_RESOLUTION_S,
)
from livemeet.transcript.segments import Segment

_PUNCT = re.compile(r"[^\w\s]")
_FINAL_ID = re.compile(r"seg-(\d+)")


@dataclass(frozen=True)
class CommitOptions:
    """`horizon_s`: s a segment's end must lie behind the audio edge before it may commit.
    `time_tolerance_s`: s by which the start and the end of one segment may move between two
    hypotheses that still agree on it."""

    horizon_s: float = COMMIT_HORIZON_S
    time_tolerance_s: float = COMMIT_TIME_TOLERANCE_S


@dataclass(frozen=True)
class CommitUpdate:
    """What one hypothesis changed: newly committed segments (with ids) and the new open tail."""

    finals: tuple[Segment, ...]
    tail: tuple[Segment, ...]


def final_id(number: int) -> str:
    """The id of a session's `number`-th final (from 1): "seg-0001", ..."""
    return f"seg-{number:04d}"


def revision_segments(
    segments: Sequence[Segment], finals: Sequence[Segment]
) -> tuple[Segment, ...]:
    """`segments` (a re-decode of the whole meeting, DESIGN 5.7) as the revision's final
    segments: ids "rev-0001", "rev-0002", ... in order, skipping any id one of the session's
    `finals` has (theirs are "seg-N": a client keeps both apart by id)."""
    used = {seg.id for seg in finals}
    out: list[Segment] = []
    number = 0
    for seg in segments:
        number += 1
        while f"rev-{number:04d}" in used:
            number += 1
        out.append(replace(seg, id=f"rev-{number:04d}", is_final=True))
    return tuple(out)


def next_final_number(finals: Sequence[Segment]) -> int:
    """The number (`final_id`) of the final committed after `finals`: past their count and
    past every "seg-N" id among them, so a new id equals none of theirs whatever their
    numbering (a gap, an id of another form)."""
    numbers = [int(m.group(1)) for seg in finals if (m := _FINAL_ID.fullmatch(seg.id))]
    return max([len(finals), *numbers]) + 1


def check_restored_finals(finals: Sequence[Segment]) -> None:
    """Raises ValueError unless `finals` can be a session's committed transcript, as
    `CommitBuffer` commits one: final segments with ids, each id once, times in seconds with
    0 <= start_s <= end_s, starts non-decreasing (speech may overlap: a segment may start
    before the one ahead of it ends)."""
    ids: set[str] = set()
    for i, seg in enumerate(finals):
        if not seg.is_final or not seg.id:
            raise ValueError(f"restored segment {i} is not a final with an id: {seg}")
        if seg.id in ids:
            raise ValueError(f"restored segment {i} repeats the id {seg.id!r}")
        ids.add(seg.id)
        if not 0.0 <= seg.start_s <= seg.end_s:
            raise ValueError(f"restored segment {seg.id!r} needs 0 <= start_s <= end_s: {seg}")
        if i and seg.start_s < finals[i - 1].start_s:
            raise ValueError(
                f"restored segment {seg.id!r} starts at {seg.start_s} s, before the one ahead "
                f"of it ({finals[i - 1].start_s} s): finals are in order of their starts"
            )


def normalise_text(text: str) -> str:
    """Case- and punctuation-insensitive form used to compare hypotheses."""
    return " ".join(_PUNCT.sub("", text.lower()).split())


def segments_agree(a: Segment, b: Segment, time_tolerance_s: float) -> bool:
    """True if `a` and `b` are the same segment: same speaker, same normalised text, and start
    and end each within `time_tolerance_s` seconds."""
    return (
        a.speaker == b.speaker
        and normalise_text(a.text) == normalise_text(b.text)
        and abs(a.start_s - b.start_s) <= time_tolerance_s
        and abs(a.end_s - b.end_s) <= time_tolerance_s
    )


def agreed_prefix(
    previous: Sequence[Segment], current: Sequence[Segment], edge_s: float, options: CommitOptions
) -> int:
    """How many leading segments of `current` may commit: the longest prefix on which
    `previous` agrees, each segment ending at least `horizon_s` before `edge_s`."""
    n = 0
    for prev, cur in zip(previous, current, strict=False):
        if cur.end_s > edge_s - options.horizon_s:
            break
        if not segments_agree(prev, cur, options.time_tolerance_s):
            break
        n += 1
    return n


class CommitBuffer:
    """The committed transcript of one session plus its open tail.

    `update()` takes each new hypothesis (session labels, absolute times, starting at or after
    `committed_end_s`); `force_commit()` commits the open tail (finalize, end, a full window).
    `restored`: finals the session committed before (a restart): they are committed already
    (never returned as new finals), and the next final's number follows theirs
    (`next_final_number`). Raises ValueError for `restored` that `check_restored_finals`
    refuses.
    """

    def __init__(
        self, options: CommitOptions | None = None, restored: Sequence[Segment] = ()
    ) -> None:
        check_restored_finals(restored)
        self.options = options or CommitOptions()
        self._committed: list[Segment] = list(restored)
        self._next_number = next_final_number(restored)
        self._tail: tuple[Segment, ...] = ()
        self._tail_edge_s = 0.0  # audio edge (s) of the hypothesis the tail came from

    @property
    def committed(self) -> tuple[Segment, ...]:
        return tuple(self._committed)

    @property
    def tail(self) -> tuple[Segment, ...]:
        return self._tail

    @property
    def committed_end_s(self) -> float:
        """End of the last final in s (0.0 before any)."""
        return self._committed[-1].end_s if self._committed else 0.0

    def update(self, hypothesis: Sequence[Segment], edge_s: float) -> CommitUpdate:
        """Commit the prefix of `hypothesis` that agrees with the previous one and lies behind
        the horizon; the remainder becomes the open tail."""
        current = tuple(hypothesis)
        n = agreed_prefix(self._tail, current, edge_s, self.options)
        shown = zip(self._tail[:n], current[:n], strict=True)
        finals = self._commit([self._confirmed(prev, cur) for prev, cur in shown])
        self._tail = tuple(as_partial(s) for s in current[n:])
        self._tail_edge_s = edge_s
        return CommitUpdate(finals, self._tail)

    def _confirmed(self, shown: Segment, later: Segment) -> Segment:
        """The final of a segment two hypotheses agree on (module docstring): `later`'s text
        with `shown`'s times, unless `shown` ends after `later` or at its decode's edge."""
        at_edge = shown.end_s >= self._tail_edge_s - STAMP_RESOLUTION_S
        if at_edge or shown.end_s > later.end_s:
            return later
        return replace(later, start_s=shown.start_s, end_s=shown.end_s)

    def relabel(self, resolve: Callable[[str], str]) -> None:
        """Give the open tail's segments the labels `resolve` maps theirs to (a speaker merge:
        the next hypothesis, mapped so, then agrees with the tail). Finals keep theirs."""
        self._tail = tuple(replace(s, speaker=resolve(s.speaker)) for s in self._tail)

    def force_commit(
        self, count: int | None = None, *, tail: Sequence[Segment] | None = None
    ) -> CommitUpdate:
        """Commit the first `count` segments of the open tail (all of it when None). `tail`
        (session labels, absolute times) replaces the open tail first: a cut commits the tail
        as the session amended it (`cut_segments` in livemeet/session/live.py)."""
        if tail is not None:
            self._tail = tuple(as_partial(s) for s in tail)
        k = len(self._tail) if count is None else max(0, min(count, len(self._tail)))
        finals = self._commit(self._tail[:k])
        self._tail = self._tail[k:]
        return CommitUpdate(finals, self._tail)

    def _commit(self, segments: Sequence[Segment]) -> tuple[Segment, ...]:
        out = []
        for seg in segments:
            start = seg.start_s
            if self._committed:
                start = max(start, self._committed[-1].start_s)
            final = replace(
                seg,
                id=final_id(self._next_number),
                is_final=True,
                start_s=start,
                end_s=max(start, seg.end_s),
            )
            self._next_number += 1
            self._committed.append(final)
            out.append(final)
        return tuple(out)


def as_partial(seg: Segment) -> Segment:
    """`seg` as an open-tail segment: no id, not final."""
    return replace(seg, id="", is_final=False)
