"""From generated token ids to segments: `SegmentStream` (detokenizer, transcript parser and
repetition guard, one token at a time) and `UploadTranscript` (an upload's final segments as
they are confirmed, with their text deltas). Used by the MOSS-TD backend (backends/moss.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from livemeet.transcriber import TranscriptFinal
from livemeet.transcript.detok import IncrementalDetokenizer
from livemeet.transcript.parser import TranscriptParser
from livemeet.transcript.repetition import RepetitionGuard
from livemeet.transcript.segments import FinishReason, Segment, Transcript, join_texts


class SegmentStream:
    """Generated token ids -> confirmed segments, through detokenizer, parser and guard.

    `push(token_id)` returns the segments released by that token; `looping` turns true when the
    repetition guard sees a loop (stop the request then). `close()` ends the stream and returns
    the rest (the open segment kept with MISSING_END, ends clamped: parser departures).
    """

    def __init__(
        self, detok: IncrementalDetokenizer, duration_s: float, history: Sequence[Segment] = ()
    ) -> None:
        """`history`: the segments forced before this decode (oldest first), whose trailing
        run counts toward the repetition guard's limits."""
        self._detok = detok
        self._parser = TranscriptParser(duration_s)
        self._guard = RepetitionGuard()
        self._guard.seed(history)
        self._closed = False

    @property
    def looping(self) -> bool:
        return self._guard.tripped

    def push(self, token_id: int) -> list[Segment]:
        if self._closed or self.looping:
            return []
        text = self._detok.push(token_id)
        return self._feed(text) if text else []

    def close(self) -> list[Segment]:
        if self._closed:
            return []
        self._closed = True
        tail = self._detok.flush()
        if self.looping:
            return []
        out = self._feed(tail) if tail else []
        for seg in self._parser.close():
            out.extend(self._guard.push(seg).release)
        return out + list(self._guard.flush())

    def _feed(self, text: str) -> list[Segment]:
        out: list[Segment] = []
        for seg in self._parser.feed(text):
            result = self._guard.push(seg)
            out.extend(result.release)
            if result.looping:
                return out
        pending = self._parser.pending()
        if pending is not None:
            self._guard.check_pending(pending.text)
        return out


class UploadTranscript:
    """The final segments of an upload as they are confirmed: ids "seg-0001"..., starts made
    non-decreasing, ends clamped to max_stamp_s, texts stripped, and a segment starting at or
    past max_stamp_s dropped (no audio under it: made up; kept, it was a zero-length cue at
    the end, which WebVTT does not allow); with the text delta of each
    (their concatenation equals `join_texts` of the segments). `max_stamp_s` (default
    `duration_s`) is the audio's end in the model's times: in marker time for MOSS-TD
    (`PromptConfig.marker_time_scale`), whose stamps run 1.008 times the audio's."""

    def __init__(self, duration_s: float, max_stamp_s: float | None = None) -> None:
        self.duration_s = duration_s
        self.max_stamp_s = duration_s if max_stamp_s is None else max_stamp_s
        self.segments: list[Segment] = []
        self.text = ""

    def add(self, seg: Segment) -> tuple[Segment, str] | None:
        """Confirm `seg`: returns the final segment as kept (see the class docstring) and the text
        it adds to the transcript's, or None when it is dropped (blank, or starting at or past
        max_stamp_s)."""
        text = seg.text.strip()
        if not text or seg.start_s >= self.max_stamp_s:
            return None
        prev_start = self.segments[-1].start_s if self.segments else 0.0
        start = max(seg.start_s, prev_start)
        end = min(max(seg.end_s, start), self.max_stamp_s)
        final = replace(
            seg,
            start_s=start,
            end_s=end,
            text=text,
            id=f"seg-{len(self.segments) + 1:04d}",
            is_final=True,
        )
        self.segments.append(final)
        longer = join_texts((self.text, text))
        assert longer.startswith(self.text), "join_texts only appends"
        delta, self.text = longer[len(self.text) :], longer
        return final, delta

    def final(self, reason: FinishReason) -> TranscriptFinal:
        """The upload's `TranscriptFinal`: every segment kept, with `reason`, coverage and
        duration_s."""
        t = Transcript(tuple(self.segments), self.duration_s, reason)
        return TranscriptFinal(t.segments, reason, t.coverage, self.duration_s)
