"""Segment-level commit policy for live transcription (DESIGN.md section 5.5).

A live backend re-decodes the open window every hop and returns a hypothesis: a list of
segments in session labels. A segment becomes final when two consecutive hypotheses agree on it
(LocalAgreement-2, the policy of whisper_streaming, applied to whole segments because MOSS-TD
has no word times) and it ends at least `horizon_s` behind the audio edge. Finals are
immutable, numbered "seg-0001", "seg-0002", ... and never re-emitted; the rest of the latest
hypothesis is the open tail, sent as a full-replacement partial.

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
from collections.abc import Sequence
from dataclasses import dataclass, replace

from livemeet.audio.constants import (
    COMMIT_HORIZON_S,
    COMMIT_TIME_TOLERANCE_S,
    STAMP_RESOLUTION_S,
)
from livemeet.transcript.segments import Segment

_PUNCT = re.compile(r"[^\w\s]")


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
    """

    def __init__(self, options: CommitOptions | None = None) -> None:
        self.options = options or CommitOptions()
        self._committed: list[Segment] = []
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

    def force_commit(self, count: int | None = None) -> CommitUpdate:
        """Commit the first `count` segments of the open tail (all of it when None)."""
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
                id=f"seg-{len(self._committed) + 1:04d}",
                is_final=True,
                start_s=start,
                end_s=max(start, seg.end_s),
            )
            self._committed.append(final)
            out.append(final)
        return tuple(out)


def as_partial(seg: Segment) -> Segment:
    """`seg` as an open-tail segment: no id, not final."""
    return replace(seg, id="", is_final=False)
