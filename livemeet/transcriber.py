"""The Transcriber interface: the one boundary between the gateway / live layer and a backend.

DESIGN.md section 3. A backend (MOSS-TD engine, demo, scripted) implements `Transcriber`; the
gateway uses nothing else. An upload is a session that receives all its audio, then `end()`.

Events are frozen dataclasses; segments cross the boundary, never tokens. Every session's event
stream ends with exactly one terminal event (`is_terminal`): `TranscriptFinal` (after `end()`),
or `Error`, or nothing after `abort()` (the stream simply stops).

Revision (DESIGN 5.7): a live session opened with `SessionOptions.revise` on a backend whose
`BackendInfo.revise` is True re-decodes the whole meeting offline after its final. Its
`TranscriptFinal` then says `revision=True` and is not terminal: exactly one more event
follows, the terminal one: `TranscriptRevised` (the re-decode, in session labels, superseding
every final), or `Error` when the re-decode failed. That `Error` fails only the revision: the
final stands (the gateway sends it as `revision_failed` and closes normally). `abort()` after
the final cancels the revision and frees what it holds (its KV). A session with no audio, or a
backend without revision, sends `TranscriptFinal` with `revision=False`, terminal as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from livemeet.audio.constants import LIVE_HOP_S, SAMPLE_RATE
from livemeet.transcript.commit import check_restored_finals
from livemeet.transcript.segments import FinishReason, Segment
from livemeet.transcript.speakers import SpeakerMerges

Samples = npt.NDArray[np.float32]  # [n] mono float32 in [-1, 1] at 16 kHz


@dataclass(frozen=True)
class LiveRestore:
    """A live session re-opened after a server restart (DESIGN 5.9), from what storage kept.

    `finals`: the session's committed finals, in order (starts non-decreasing), as they were
    sent: final segments with their stable ids, session labels, and the backend's timestamps
    (s; marker time for MOSS-TD). The owner then appends ALL of the session's audio again from
    sample 0 (16 kHz mono float32, as before; as fast as it likes), and the client's live
    audio after it. The backend goes on as if it had committed these finals itself: it never
    sends them again (no `SegmentFinal` for them), new finals' ids follow theirs without
    collision, their labels keep their speakers and a new speaker gets another, decoding
    resumes at the last one's end, and `TranscriptFinal` holds them first. Partial revisions
    (`SegmentPartial.rev`) start again from 1.
    `merges`: the session's speaker merges so far, (label, target) pairs in merge order
    (`TranscriberSession.merge_speakers`): the backend goes on writing no merged-away label.
    Raises ValueError for finals a session could not have committed: a segment that is not
    final or has no id, an id twice, start_s < 0 or > end_s, starts out of order; and for
    merges that `SpeakerMerges` refuses (a label merged twice, a cycle).
    """

    finals: tuple[Segment, ...]
    merges: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        check_restored_finals(self.finals)
        SpeakerMerges(self.merges)


@dataclass(frozen=True)
class SessionOptions:
    """What a session is opened with.

    `sample_rate` is always 16 kHz after the gateway; it is kept for assertion.
    `live` selects live behaviour (hops, partials, commits) over upload behaviour (decode once
    at `end()`, text deltas). `prompt` replaces the default instruction; `hotwords` are appended
    to it in the upstream form (MODEL.md section 5.2). `hop_s` is the live re-decode interval in
    audio seconds. `language` is echoed only: MOSS-TD has no language conditioning.
    `restore` re-opens a live session after a restart from its stored finals (`LiveRestore`);
    a backend's `open` raises InvalidRequest for it on an upload (`live` False), or for finals
    that `LiveRestore` refuses (checked again there: unpickling skips its check).
    `revise`: after a live session's final, re-decode the whole meeting offline and send it as
    `TranscriptRevised` (module docstring); ignored by a backend without `BackendInfo.revise`
    and for uploads (an upload's decode is offline already).
    """

    sample_rate: int = SAMPLE_RATE
    live: bool = True
    prompt: str | None = None
    hotwords: tuple[str, ...] = ()
    language: str | None = None
    hop_s: float = LIVE_HOP_S
    max_new_tokens: int | None = None
    restore: LiveRestore | None = None
    revise: bool = False


@dataclass(frozen=True)
class BackendInfo:
    """A backend: its registered name, the model id it serves, whether it is the demo, and
    whether it can revise a live session's transcript after its final (`SessionOptions.revise`).
    `language`: the one language its model transcribes, named as OpenAI's `verbose_json` names
    a detected one ("english"), or None where it may be any; `language_code` that language's
    ISO 639-1 code ("en"), which a request's `language` must name (transcript.language)."""

    name: str
    model_id: str
    demo: bool = False
    diarization: bool = True
    revise: bool = False
    language: str | None = None
    language_code: str | None = None


@dataclass(frozen=True)
class SegmentPartial:
    """The open (uncommitted) tail, as a full replacement of the previous partial.

    `rev` increases by one with every partial of a session; `segments` may be empty.
    """

    rev: int
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class SegmentFinal:
    """One committed segment; immutable from now on, with a stable `segment.id`."""

    segment: Segment


@dataclass(frozen=True)
class TextDelta:
    """Text appended to the plain transcript (uploads with streaming): the concatenation of all
    deltas of a session equals `TranscriptFinal.transcript.text`. Never splits a character."""

    text: str


@dataclass(frozen=True)
class TranscriptFinal:
    """The whole transcript after `end()`: committed segments plus the decoded tail.
    `revision`: a `TranscriptRevised` (or an `Error`: the revision failed) follows; this event
    is then not terminal (module docstring). `merged`: the session's speaker merges,
    (label, the label it shows as) pairs, which the gateway sets (a backend leaves it empty:
    docs/protocol.md, "Speaker merges")."""

    segments: tuple[Segment, ...]
    finish_reason: FinishReason
    coverage: float  # fraction of the audio duration covered by segments, in [0, 1]
    duration_s: float
    revision: bool = False
    merged: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TranscriptRevised:
    """An offline-quality re-decode of the whole meeting that replaces earlier finals: final
    segments in session labels (a speaker the session never had gets a label it never used,
    a merged-away label none), with ids no final of the session has. Terminal. `merged`: as
    `TranscriptFinal.merged`."""

    segments: tuple[Segment, ...]
    supersedes: tuple[str, ...]  # ids of the replaced segments: every final of the session
    finish_reason: FinishReason = FinishReason.STOP
    merged: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Error:
    """A failure of this session (after a `TranscriptFinal` with `revision`: of its revision
    only). Terminal: nothing follows it."""

    code: str
    message: str
    retryable: bool = False


Event = SegmentPartial | SegmentFinal | TextDelta | TranscriptFinal | TranscriptRevised | Error


def is_terminal(event: object) -> bool:
    """Whether `event` ends its session's stream: an `Error`, a `TranscriptRevised`, or a
    `TranscriptFinal` with no revision to follow."""
    if isinstance(event, TranscriptFinal):
        return not event.revision
    return isinstance(event, TranscriptRevised | Error)


class TranscriberSession(Protocol):
    """One audio stream being transcribed. Methods never block the event loop."""

    @property
    def id(self) -> str: ...

    async def append(self, samples: Samples) -> None:
        """New audio, 16 kHz mono float32 [n]. Raises ProtocolError after end()/abort()."""

    async def finalize(self) -> None:
        """Commit everything heard so far; the session stays open."""

    async def end(self) -> None:
        """No more audio: produce `TranscriptFinal` (then `TranscriptRevised`, or an `Error`
        for the revision, where the final says `revision`)."""

    async def merge_speakers(self, speaker: str, into: str) -> None:
        """A live session's client merged the label `speaker` into `into` (DESIGN 5.6;
        docs/protocol.md, `speaker.merge`): both are labels the session has shown, `speaker`
        not merged away and `into` its own target (the gateway checked them). From now on no
        segment the session sends carries `speaker`: it writes `into` where it would have
        (finals already sent keep their labels). Applies after `end()` too, until the final.
        Does nothing once the session finished or was aborted; raises the session's error
        once it failed."""

    async def abort(self) -> None:
        """Free everything now (after the final: cancels the revision). Idempotent. The event
        stream stops."""

    def events(self) -> AsyncIterator[Event]:
        """The session's events in order; ends after the terminal event or an abort."""
        ...


class Transcriber(Protocol):
    """A backend. `start()` loads the model; `close()` frees it. Both idempotent."""

    @property
    def info(self) -> BackendInfo:
        """What the backend serves (name, model id, demo, language)."""
        ...

    @property
    def ready(self) -> bool:
        """True while sessions may open: the model is loaded and its engine is up (False before
        `start()`, while an engine restarts, and after `close()`)."""
        ...

    @property
    def failed(self) -> bool:
        """True once the backend is gone for good (its engine could not be started again):
        the process needs replacing, and /healthz says so."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def open_session(self, options: SessionOptions) -> TranscriberSession:
        """Open a session. Raises QueueFull at capacity, EngineUnavailable when not ready."""
        ...


@runtime_checkable
class SlottedTranscriber(Protocol):
    """A transcriber with a fixed number of session slots (EngineClient's --max-sessions): the
    gateway refuses an upload while none is free before it reads the body, rather than after
    receiving and decoding it only for `open_session` to raise QueueFull."""

    @property
    def free_slots(self) -> int:
        """Sessions `open_session` would open now before raising QueueFull (>= 0)."""
        ...


@runtime_checkable
class RestartingTranscriber(Protocol):
    """A transcriber that starts its engine again after losing it (EngineClient), and knows
    when it tries next: what a refusal meanwhile tells a client to wait (HTTP Retry-After)."""

    @property
    def restart_in_s(self) -> float | None:
        """s until the next attempt to start the engine (0 while one is under way); None when
        no restart is under way."""
        ...
