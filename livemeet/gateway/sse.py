"""Server-sent events for streamed uploads: the flush policy and the wire encoding.

Pure code: no asyncio, no sockets, time passed in by the caller (seconds, any monotonic clock).
Flush rule (DESIGN.md section 6): the first text goes out at once; later text is held for at
most `interval_s` (50 ms) and sent as one delta; the end flushes everything; a delta never ends
inside a UTF-8 character, even when the text arrives as bytes split mid-character.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Mapping

from livemeet.audio.constants import FLUSH_INTERVAL_S
from livemeet.transcript.segments import join_texts


class DeltaFlusher:
    """Coalesces text deltas into flushes at most every `interval_s` seconds.

    `push(text, now)` returns the text to send now (or "" to hold it); `due_in(now)` says how
    long until held text must go out (None when nothing is held); `poll(now)` returns what is
    due; `finish()` returns everything held. Bytes are decoded incrementally as UTF-8, so a
    character split across pushes is held until it is whole.
    """

    def __init__(self, interval_s: float = FLUSH_INTERVAL_S) -> None:
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        self.interval_s = interval_s
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._pending = ""
        self._last_flush_s: float | None = None

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def push(self, data: str | bytes, now: float) -> str:
        """Add text (str, or UTF-8 bytes possibly cut mid-character); return what to send now.

        Raises UnicodeDecodeError on bytes that are not UTF-8.
        """
        self._pending += self._decoder.decode(data) if isinstance(data, bytes) else data
        return self.poll(now)

    def due_in(self, now: float) -> float | None:
        """Seconds until held text must be flushed (0 when overdue); None when nothing is held."""
        if not self._pending:
            return None
        if self._last_flush_s is None:
            return 0.0
        return max(0.0, self._last_flush_s + self.interval_s - now)

    def poll(self, now: float) -> str:
        """The held text if its flush time has come, else ""."""
        due = self.due_in(now)
        if due is None or due > 0:
            return ""
        return self._take(now)

    def finish(self) -> str:
        """Everything held, including a dangling partial character (as U+FFFD)."""
        try:
            self._pending += self._decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            self._pending += "\ufffd"
            self._decoder.reset()
        out, self._pending = self._pending, ""
        return out

    def _take(self, now: float) -> str:
        out, self._pending = self._pending, ""
        self._last_flush_s = now
        return out


class TextTracker:
    """Keeps the streamed plain text equal to the final transcript text.

    A backend may stream `TextDelta`s itself; if it does not, deltas are derived from final
    segments (the joined text of all finals so far minus what was already sent). `final_tail()`
    gives what is still missing once the whole text is known.
    """

    def __init__(self) -> None:
        self.sent = ""
        self._backend_streams = False
        self._finals: list[str] = []

    def on_backend_delta(self, text: str) -> str:
        """A `TextDelta` the backend streamed: returned as it is to send; from now on final segments
        add no deltas of their own."""
        self._backend_streams = True
        self.sent += text
        return text

    def on_final_segment(self, text: str) -> str:
        """A final segment's text: the delta to send ("" when the backend streams its own deltas, or
        when what was sent is not a prefix of the finals' joined text)."""
        self._finals.append(text)
        if self._backend_streams:
            return ""
        return self._advance_to(join_texts(self._finals))

    def final_tail(self, full_text: str) -> str:
        """The delta still needed so that all deltas concatenated equal `full_text` ("" if they
        already do, or if what was sent diverged from it and cannot be repaired by appending)."""
        return self._advance_to(full_text)

    def _advance_to(self, target: str) -> str:
        if not target.startswith(self.sent):
            return ""
        delta = target[len(self.sent) :]
        self.sent = target
        return delta


def encode_event(payload: Mapping[str, object]) -> bytes:
    """One SSE message: `data: <json>` and a blank line (the openai client reads `data` only)."""
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def encode_events(payloads: Iterable[Mapping[str, object]]) -> bytes:
    """The SSE messages of `payloads`, concatenated (`encode_event`)."""
    return b"".join(encode_event(p) for p in payloads)
