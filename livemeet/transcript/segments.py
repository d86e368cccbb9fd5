"""Transcript segments: the unit that crosses every boundary (engine, gateway, writers).

MOSS-TD writes `[start][Sxx]text[end]` segments with absolute times in seconds and no word
times (MODEL.md section 6), so a segment is the finest timed unit livemeet has.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum


class SegmentFlag(StrEnum):
    """Why a segment departs from the model's literal output (MODEL.md section 6 departures)."""

    INHERITED_SPEAKER = "inherited_speaker"  # no [Sxx] tag; took the previous segment's speaker
    MISSING_END = "missing_end"  # no end timestamp before EOS; end set from the audio
    END_CLAMPED = "end_clamped"  # end time was past the audio end and was clamped to it
    REPETITION_CUT = "repetition_cut"  # text cut where it began to repeat (a decode loop)
    # a live session's last decode stopped before it: kept as the client's partial showed it
    FROM_PARTIAL = "from_partial"


@dataclass(frozen=True)
class Segment:
    """One speaker-labelled, timed stretch of text.

    `start_s`/`end_s` are seconds from the start of the audio (start_s <= end_s).
    `speaker` is a session label such as "S01". `text` never contains [ts] or [Sxx] tags.
    `id` is stable once the segment is final (e.g. "seg-0003"); partial segments may use "".
    """

    start_s: float
    end_s: float
    speaker: str
    text: str
    id: str = ""
    is_final: bool = False
    flags: tuple[SegmentFlag, ...] = field(default_factory=tuple)

    def with_id(self, segment_id: str) -> Segment:
        """A copy with `id` set."""
        return replace(self, id=segment_id)

    def to_wire(self) -> dict[str, object]:
        """The JSON form used on every wire: `{id, start, end, speaker, text}` (+ flags if any)."""
        out: dict[str, object] = {
            "id": self.id,
            "start": round(self.start_s, 3),
            "end": round(self.end_s, 3),
            "speaker": self.speaker,
            "text": self.text,
            **self.wire_flags(),
        }
        return out

    def wire_flags(self) -> dict[str, object]:
        """`{"flags": [values]}` when the segment has flags, else `{}`: how every wire and
        upload format carries them."""
        return {"flags": [f.value for f in self.flags]} if self.flags else {}


class FinishReason(StrEnum):
    """Why a transcript ended."""

    STOP = "stop"  # the model emitted EOS / the backend saw all audio
    LENGTH = "length"  # the output budget (max_new_tokens or context) cut it
    REPETITION = "repetition"  # the repetition guard cut a loop
    ABORT = "abort"  # the client or server aborted the session


@dataclass(frozen=True)
class Transcript:
    """A complete transcript of one audio stream.

    `duration_s` is the audio duration in seconds; `coverage` is the fraction in [0, 1] of that
    duration up to the last segment end (a cut transcript has coverage well below 1).
    `speaker_names`: (label, name) pairs a live client gave (`speaker.rename`), in the order
    first named; segments keep their labels, writers show a name where one is given. Uploads
    have none. `speaker_merges`: (label, the label it shows as) pairs of the labels a live
    client merged away (`speaker.merge`), in merge order, each resolved to its target (one
    look-up); writers show a merged label's segments as its target's (its name, else it).
    """

    segments: tuple[Segment, ...]
    duration_s: float
    finish_reason: FinishReason = FinishReason.STOP
    language: str | None = None
    speaker_names: tuple[tuple[str, str], ...] = ()
    speaker_merges: tuple[tuple[str, str], ...] = ()

    @property
    def text(self) -> str:
        """Plain text: segment texts joined by single spaces (CJK joined without spaces)."""
        return join_texts(s.text for s in self.segments)

    @property
    def coverage(self) -> float:
        if self.duration_s <= 0 or not self.segments:
            return 0.0
        return min(1.0, max(s.end_s for s in self.segments) / self.duration_s)

    @property
    def speakers(self) -> tuple[str, ...]:
        """The segments' labels, each once, in order of first appearance."""
        seen: dict[str, None] = {}
        for s in self.segments:
            seen.setdefault(s.speaker, None)
        return tuple(seen)


def is_cjk(ch: str) -> bool:
    """Whether `ch` is written without spaces between words (CJK, kana, Hangul syllables,
    full-width forms and CJK punctuation): `join_texts` joins such texts without a space."""
    cp = ord(ch)
    return (
        0x3040 <= cp <= 0x30FF  # kana
        or 0x3400 <= cp <= 0x4DBF  # CJK ext A
        or 0x4E00 <= cp <= 0x9FFF  # CJK unified
        or 0xAC00 <= cp <= 0xD7AF  # hangul
        or 0xF900 <= cp <= 0xFAFF
        or 0xFF00 <= cp <= 0xFFEF  # full-width forms and punctuation
        or 0x3000 <= cp <= 0x303F  # CJK punctuation
    )


def join_texts(texts: Iterable[str]) -> str:
    """Join segment texts: a space between two pieces unless both sides of the joint are CJK."""
    out = ""
    for raw in texts:
        t = raw.strip()
        if not t:
            continue
        if out and not (is_cjk(out[-1]) and is_cjk(t[0])):
            out += " "
        out += t
    return out


def word_end_times(seg: Segment) -> tuple[float, ...]:
    """End times (s) of `seg`'s words in a synthetic meeting, whose reference transcript has no
    word times: by the benchmarks' convention (docs/benchmarks.md, "partial latency") a
    segment's n words (its text's whitespace-separated parts: CJK text without spaces is one
    word, shown only whole) are spoken at a uniform rate, word i (0-based) ending at start +
    (i + 1) (end - start) / n; the last ends with the segment. Empty for a text with no
    word. `--forced-output` live hops write the words spoken by their audio edge, and
    `loadtest.bench_live` measures each word's latency from its end."""
    n = len(seg.text.split())
    span = seg.end_s - seg.start_s
    ends = [seg.start_s + (i + 1) * span / n for i in range(n - 1)]
    return (*ends, seg.end_s) if n else ()  # the last exactly at the end, whatever the rounding
