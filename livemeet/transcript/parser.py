"""Incremental parser for MOSS-TD output: `[start][Sxx]text[end][start][Sxx]text[end]...`.

A character scanner (no regex over the whole text), so any chunking of the text gives the same
segments. Semantics follow the upstream `TranscriptStreamParser` (MODEL.md section 6):

- anything before the first `[timestamp]` is ignored (noise prefix);
- a timestamp is 1-32 characters of digits with at most one `.` and at least one digit; colon
  times (`1:02`) are not timestamps;
- a speaker tag is `S` followed by digits, at most 16 characters; whitespace may separate
  `[start]` and `[Sxx]`;
- inside the text, `[` opens a candidate end timestamp. A bracket that is not a timestamp, or an
  end before the start, goes back into the text verbatim;
- a valid end is held until the next `[` (which starts the next segment) or `close()`; any other
  non-space character first means the "end" was numeric text (`第[2024]年`) and it is folded back
  into the text together with the whitespace that followed it;
- text is stripped and segments with empty text are skipped.

Three deliberate departures, each recorded on the segment as a `SegmentFlag`:

- INHERITED_SPEAKER: a segment with no speaker tag takes the previous segment's speaker
  (`S01` if it is the first) instead of a fixed default;
- MISSING_END: a segment still open at `close()` is kept, ending at the audio end (or at its
  start when the audio duration is unknown or earlier) instead of being dropped;
- END_CLAMPED: an end past the audio duration is clamped to it (never below the start).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from enum import Enum, auto

from livemeet.transcript.segments import Segment, SegmentFlag

MAX_TIMESTAMP_CHARS = 32  # upstream limit on a [timestamp] body
MAX_SPEAKER_CHARS = 16  # upstream limit on a [Sxx] body, "S" included
FIRST_SPEAKER = "S01"  # speaker for an untagged first segment (upstream default_speaker)


class _State(Enum):
    SEEK_START = auto()  # before a segment: skip to the next "["
    READ_START = auto()  # inside "[start"
    EXPECT_SPEAKER = auto()  # after "[start]": whitespace, then "[" or the text
    READ_SPEAKER = auto()  # inside "[Sxx"
    READ_TEXT = auto()  # segment text
    READ_END = auto()  # inside a candidate "[end"
    AFTER_END = auto()  # after a valid "[end]": waiting for "[" to confirm it

    # members are singletons compared by identity: hash them by identity too, in C (Enum's
    # own hashes the name in Python, once per character fed)
    __hash__ = object.__hash__


class TranscriptParser:
    """Sans-I/O parser from detokenised MOSS-TD text to `Segment`s.

    `audio_duration_s`: the duration of the decoded audio in seconds, used to clamp end times
    and to end a segment left open at `close()`; None if unknown.
    Segments are returned with `id == ""` and `is_final == False`: ids and finality belong to
    the commit layer. `close()` is terminal; `feed()` after it raises RuntimeError.
    """

    def __init__(self, audio_duration_s: float | None = None) -> None:
        if audio_duration_s is not None and audio_duration_s < 0:
            raise ValueError(f"audio_duration_s must be >= 0, got {audio_duration_s}")
        self.audio_duration_s = audio_duration_s
        self._state = _State.SEEK_START
        self._token: list[str] = []  # body of the bracket being read
        self._text: list[str] = []
        self._after_end_space: list[str] = []  # whitespace seen after a held end
        self._start: float | None = None
        self._end: float | None = None
        self._end_token = ""
        self._speaker: str | None = None
        self._inherited = False
        self._last_speaker: str | None = None
        self._closed = False
        self._out: list[Segment] = []
        # the handler of each state, built once: a live hop feeds its parser ~14 tokens and
        # the engine thread feeds every hop's (an Enum hashes in Python: keep it off the path)
        self._step: dict[_State, Callable[[str], None]] = {
            _State.SEEK_START: self._seek_start,
            _State.READ_START: self._read_start,
            _State.EXPECT_SPEAKER: self._expect_speaker,
            _State.READ_SPEAKER: self._read_speaker,
            _State.READ_TEXT: self._read_text,
            _State.READ_END: self._read_end,
            _State.AFTER_END: self._after_end,
        }

    def feed(self, text: str) -> list[Segment]:
        """Consume more output text; return the segments it confirmed, in order."""
        if self._closed:
            raise RuntimeError("feed() after close()")
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        step = self._step
        for ch in text:
            step[self._state](ch)
        return self._take()

    def pending(self) -> Segment | None:
        """The segment being written (a partial), or None when there is no text yet.

        Its end is the held end timestamp if one was read, else its start (flag MISSING_END).
        A half-read `[end` bracket is not shown.
        """
        if self._state not in (_State.READ_TEXT, _State.READ_END, _State.AFTER_END):
            return None
        text = "".join(self._text).strip()
        if not text:
            return None
        return self._segment(text, self._end, partial=True)

    def close(self) -> list[Segment]:
        """End of output: return the held segment and the open one (MISSING_END), if any."""
        if self._closed:
            return []
        if self._state is _State.AFTER_END:
            self._emit()
        elif self._state in (_State.READ_TEXT, _State.READ_END):
            if self._state is _State.READ_END:
                self._text.append("[")
                self._text.extend(self._token)
            self._emit()
        self._closed = True
        return self._take()

    # -- states -----------------------------------------------------------------------------

    def _seek_start(self, ch: str) -> None:
        if ch == "[":
            self._token.clear()
            self._state = _State.READ_START

    def _read_start(self, ch: str) -> None:
        if ch == "]":
            start = _parse_timestamp(self._token)
            self._token.clear()
            if start is None:
                self._state = _State.SEEK_START
            else:
                self._start = start
                self._state = _State.EXPECT_SPEAKER
            return
        if _is_timestamp_char(ch) and len(self._token) < MAX_TIMESTAMP_CHARS:
            self._token.append(ch)
            return
        self._restart(ch)

    def _expect_speaker(self, ch: str) -> None:
        if ch == "[":
            self._token.clear()
            self._state = _State.READ_SPEAKER
        elif not ch.isspace():
            self._speaker = self._last_speaker or FIRST_SPEAKER
            self._inherited = True
            self._text.clear()
            self._state = _State.READ_TEXT
            self._read_text(ch)

    def _read_speaker(self, ch: str) -> None:
        if ch == "]":
            speaker = _parse_speaker(self._token)
            self._token.clear()
            if speaker is None:
                self._reset_segment()
                self._state = _State.SEEK_START
            else:
                self._speaker = speaker
                self._inherited = False
                self._text.clear()
                self._state = _State.READ_TEXT
            return
        if _is_speaker_char(ch) and len(self._token) < MAX_SPEAKER_CHARS:
            self._token.append(ch)
            return
        self._restart(ch)

    def _read_text(self, ch: str) -> None:
        if ch == "[":
            self._token.clear()
            self._state = _State.READ_END
        else:
            self._text.append(ch)

    def _read_end(self, ch: str) -> None:
        if ch == "]":
            end = _parse_timestamp(self._token)
            assert self._start is not None
            if end is not None and end >= self._start:
                self._end = end
                self._end_token = "".join(self._token)
                self._after_end_space.clear()
                self._state = _State.AFTER_END
            else:
                self._text.extend(("[", *self._token, "]"))
                self._state = _State.READ_TEXT
            self._token.clear()
            return
        if _is_timestamp_char(ch) and len(self._token) < MAX_TIMESTAMP_CHARS:
            self._token.append(ch)
            return
        # Not a timestamp: the bracket and this character are text (a "[" here is text too).
        self._text.extend(("[", *self._token, ch))
        self._token.clear()
        self._state = _State.READ_TEXT

    def _after_end(self, ch: str) -> None:
        if ch == "[":
            self._emit()
            self._token.clear()
            self._state = _State.READ_START
        elif ch.isspace():
            self._after_end_space.append(ch)
        else:
            # The "end" was numeric text such as 第[2024]年: fold it back.
            self._text.extend(("[", self._end_token, "]", *self._after_end_space, ch))
            self._after_end_space.clear()
            self._end = None
            self._end_token = ""
            self._state = _State.READ_TEXT

    # -- helpers ----------------------------------------------------------------------------

    def _restart(self, ch: str) -> None:
        """Abandon the header being read; a "[" may open the next one."""
        self._reset_segment()
        self._token.clear()
        self._state = _State.READ_START if ch == "[" else _State.SEEK_START

    def _emit(self) -> None:
        text = "".join(self._text).strip()
        if text and self._start is not None and self._speaker is not None:
            self._out.append(self._segment(text, self._end))
        if self._speaker is not None:
            self._last_speaker = self._speaker
        self._reset_segment()
        self._state = _State.SEEK_START

    def _segment(self, text: str, end: float | None, *, partial: bool = False) -> Segment:
        """A segment from the current state; `end` None means no end tag was read: it becomes
        the audio end (at close) or the start (for a partial)."""
        assert self._start is not None and self._speaker is not None
        start = self._start
        flags: list[SegmentFlag] = []
        if self._inherited:
            flags.append(SegmentFlag.INHERITED_SPEAKER)
        duration = self.audio_duration_s
        if end is None:
            flags.append(SegmentFlag.MISSING_END)
            known = not partial and duration is not None and duration >= start
            end = duration if known and duration is not None else start
        elif duration is not None and end > duration:
            flags.append(SegmentFlag.END_CLAMPED)
            end = max(duration, start)
        return Segment(
            start_s=start, end_s=end, speaker=self._speaker, text=text, flags=tuple(flags)
        )

    def _reset_segment(self) -> None:
        self._text.clear()
        self._after_end_space.clear()
        self._start = None
        self._end = None
        self._end_token = ""
        self._speaker = None
        self._inherited = False

    def _take(self) -> list[Segment]:
        out, self._out = self._out, []
        return out


def _parse_timestamp(chars: list[str]) -> float | None:
    """Seconds from a bracket body of digits with at most one "." and at least one digit."""
    digits = sum(c.isascii() and c.isdigit() for c in chars)
    dots = chars.count(".")
    if digits == 0 or dots > 1 or digits + dots != len(chars):
        return None
    return float("".join(chars))


def _parse_speaker(chars: list[str]) -> str | None:
    if len(chars) < 2 or chars[0] != "S" or not all("0" <= c <= "9" for c in chars[1:]):
        return None
    return "".join(chars)


def is_speaker_label(label: str) -> bool:
    """Whether `label` is a speaker label as the model writes one (MODEL.md section 6): "S"
    and at least one ASCII digit, at most MAX_SPEAKER_CHARS characters in all."""
    return len(label) <= MAX_SPEAKER_CHARS and _parse_speaker(list(label)) is not None


def _is_timestamp_char(ch: str) -> bool:
    return "0" <= ch <= "9" or ch == "."


def _is_speaker_char(ch: str) -> bool:
    return ch == "S" or "0" <= ch <= "9"


def parse_transcript(text: str, audio_duration_s: float | None = None) -> list[Segment]:
    """All segments of a complete output text (feed + close)."""
    parser = TranscriptParser(audio_duration_s)
    return parser.feed(text) + parser.close()


def takes_leading_space(text: str) -> bool:
    """Whether the model writes a space before `text` after its speaker tag (BPE's word-initial
    space; parsers strip it): unless the text holds a wide character (CJK text has none, also
    when it starts with digits or a quote: `2024年`)."""
    text = text.strip()
    return bool(text) and not any(unicodedata.east_asian_width(c) in ("W", "F") for c in text)


def render_segment(seg: Segment, *, space: bool | None = None, closed: bool = True) -> str:
    """`seg` in the model's output grammar (MODEL.md section 6): `[start][Sxx] text[end]`, times
    to 2 decimals, so a rendered transcript tokenizes as the model would have written it. The
    text gets back the leading space the model writes before it (`takes_leading_space`; `space`
    decides it instead, e.g. from a whole segment of which `seg` holds the first words);
    `closed=False` leaves out the end stamp (a segment still being written)."""
    text = seg.text.strip()
    if text and (takes_leading_space(text) if space is None else space):
        text = " " + text
    end = f"[{seg.end_s:.2f}]" if closed else ""
    return f"[{seg.start_s:.2f}][{seg.speaker}]{text}{end}"
