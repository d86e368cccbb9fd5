"""`RedecodeCore`: a generic `BackendCore` for backends that can transcribe a window of audio.

Live sessions re-decode their open window every hop through `LiveSession` (commit policy and
speaker mapping live there); one re-opened after a restart (`SessionOptions.restore`) decodes
from its restored finals' end, with their recent text in the prompt. Upload sessions
(`SessionOptions.live` False) buffer all audio and are decoded after `end()`, one window per
step (`upload_pieces`); each window's segments go out as they are decoded, each as a
`TextDelta` (all of them concatenated equal the transcript's `.text`) and a `SegmentFinal`, and
`TranscriptFinal` follows the last window.
A subclass provides `info`, `load()` and `transcribe_window()`; it may override
`upload_pieces()` (the default walks consecutive <= 30 s windows).

One `step()` runs at most one window decode: one live session's hop or one window of one
upload, so a step's duration is bounded by one window decode (a 90-minute upload is ~180
steps, not one). Live hops go first, round-robin; an upload window runs when no hop is due, or
once every live session with a hop due has had a step since the last upload window, so a hop
waits behind at most one upload window and uploads still advance while hops keep coming.
Uploads are served oldest first, each to its end.

Revision (DESIGN 5.7; `SessionOptions.revise`, for a subclass whose `info.revise` is True): a
live session's `TranscriptFinal` says `revision`, and a later step re-decodes the whole
meeting (`revise_meeting`) at upload priority (it waits its turn as an upload window does),
maps it onto the session's labels and sends `TranscriptRevised` superseding every final; a
failure sends an `Error` instead (the final stands). This core keeps no audio of a live
session (`LiveSession` drops what it decoded), so a subclass revises from what it keeps itself.
"""

from __future__ import annotations

import abc
import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from livemeet.audio.constants import SAMPLE_RATE, UPLOAD_LOOP_MIN_REPEATS, WINDOW_SAMPLES
from livemeet.backends.base import restored_finals, restored_merges
from livemeet.backends.segment_stream import UploadTranscript
from livemeet.engine.messages import EngineStats
from livemeet.errors import InvalidRequest, LivemeetError, NotFound, ProtocolError, unexpected_text
from livemeet.session.live import LiveOptions, LiveSession, Window, clean_hypothesis
from livemeet.transcriber import (
    BackendInfo,
    Error,
    Event,
    Samples,
    SegmentFinal,
    SessionOptions,
    TextDelta,
    TranscriptFinal,
    TranscriptRevised,
    is_terminal,
)
from livemeet.transcript.commit import revision_segments
from livemeet.transcript.repetition import find_segment_loop
from livemeet.transcript.segments import FinishReason, Segment, SegmentFlag
from livemeet.transcript.speakers import map_revision

log = logging.getLogger(__name__)


@dataclass
class _UploadJob:
    """An upload being decoded: `pieces` yields the segments of one window per `next()`;
    `transcript` makes them the upload's final segments and text deltas, as the MOSS
    backend's uploads are made."""

    pieces: Iterator[list[Segment]]
    transcript: UploadTranscript


@dataclass
class _Session:
    options: SessionOptions
    live: LiveSession | None  # None for an upload
    upload: list[Samples] = field(default_factory=list)
    ended: bool = False
    job: _UploadJob | None = None  # an upload's decode, from its first step after end()
    revising: TranscriptFinal | None = None  # a live session's final, its revision due


def _offline(sess: _Session) -> bool:
    """An upload, or a live session's revision: served as uploads are (module docstring)."""
    return sess.live is None or sess.revising is not None


class RedecodeCore(abc.ABC):
    """Base class; see the module docstring. Implements the `BackendCore` protocol."""

    # Pass the recent committed text to `transcribe_window` as part of the prompt.
    use_committed_prompt = True
    # Pass the session's `prompt` and `hotwords` to `transcribe_window` as part of the prompt.
    use_request_prompt = True
    # segments; a run this long of one text in an upload window is a decode loop (upload_pieces)
    upload_loop_min_repeats = UPLOAD_LOOP_MIN_REPEATS

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        # live hops since the last upload window: at the number of live sessions, an upload
        # waiting gets the next step (module docstring)
        self._num_live_steps = 0

    # -- what a subclass provides -------------------------------------------------------------

    @property
    @abc.abstractmethod
    def info(self) -> BackendInfo: ...

    @abc.abstractmethod
    def load(self) -> None: ...

    @abc.abstractmethod
    def transcribe_window(
        self, samples: Samples, offset_s: float, prompt: str | None
    ) -> list[Segment]:
        """Transcribe `samples` [n] float32 16 kHz (n <= 30 s) that start `offset_s` s into the
        session. Returns segments with absolute times (s from the session start)."""

    def revise_meeting(self, duration_s: float, prompt: str | None) -> list[Segment]:
        """Re-decode a whole live meeting of `duration_s` s offline (module docstring), in this
        backend's own labels, times from 0. Only called where `info.revise` is True; raises
        NotImplementedError otherwise."""
        raise NotImplementedError(f"{type(self).__name__} cannot revise a live session")

    def upload_pieces(self, samples: Samples, prompt: str | None) -> Iterator[list[Segment]]:
        """Transcribe a whole file [n] float32 16 kHz, any length, times from 0, lazily: each
        `next()` decodes at most one window and yields its segments (maybe none), in order.

        Default: consecutive 30 s windows; a window's last segment, possibly cut by the window
        boundary, is re-decoded at the start of the next window. A window whose segments loop
        (`upload_loop_min_repeats` copies of one text in a row, `find_segment_loop`) keeps the
        loop's first copy, flagged REPETITION_CUT, and the next window starts at its end: a
        greedy decode that looped from one offset reads the speech from another (the trial's
        27 x "I don't know." did), and a genuine run is written again from there. A loop whose
        first copy reaches the window's end drops every copy: the next window starts at it."""
        start = 0
        while start < samples.size:
            stop = min(start + WINDOW_SAMPLES, samples.size)
            offset_s = start / SAMPLE_RATE
            segs = list(self.transcribe_window(samples[start:stop], offset_s, prompt))
            next_start = stop
            loop = find_segment_loop(segs, self.upload_loop_min_repeats)
            first = segs[loop] if loop is not None else None
            if first is not None and stop < samples.size and first.end_s * SAMPLE_RATE >= stop:
                # copies of the window's last segment, cut by its end: re-decoded from its start
                # with the next window, as without a loop (or from the window's end)
                cut = round(first.start_s * SAMPLE_RATE)
                segs, next_start = segs[:loop], cut if cut > start else stop
            elif first is not None:
                # the first copy's end, or a later segment's where that is not past the
                # window's start (zero-length stamps), else the window's end: the walk advances
                ends = (round(seg.end_s * SAMPLE_RATE) for seg in segs[loop:])
                next_start = next((end for end in ends if end > start), stop)
                segs = [
                    *segs[:loop],
                    replace(first, flags=(*first.flags, SegmentFlag.REPETITION_CUT)),
                ]
            elif stop < samples.size and len(segs) >= 2:
                cut = round(segs[-1].start_s * SAMPLE_RATE)
                if cut > start:
                    segs, next_start = segs[:-1], cut
            yield segs
            start = next_start

    def transcribe_upload(self, samples: Samples, prompt: str | None) -> list[Segment]:
        """All of `upload_pieces` at once (offline use and tests; sessions decode by piece)."""
        return [seg for piece in self.upload_pieces(samples, prompt) for seg in piece]

    def close(self) -> None:
        """Free the model; a subclass that holds one overrides this and calls super()."""
        self._sessions.clear()

    # -- BackendCore --------------------------------------------------------------------------

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    def open(self, session_id: str, options: SessionOptions) -> None:
        """Open a live session (a LiveSession) or an upload (BackendCore). Raises InvalidRequest for
        an id already open, a sample rate other than SAMPLE_RATE (16 kHz), bad live settings, or a
        bad restore (`restored_finals`)."""
        if session_id in self._sessions:
            raise InvalidRequest(f"session {session_id!r} is already open")
        if options.sample_rate != SAMPLE_RATE:
            raise InvalidRequest(f"sample_rate must be {SAMPLE_RATE}, not {options.sample_rate}")
        restored = restored_finals(options)
        live = None
        if options.live:
            try:
                live = LiveSession(
                    LiveOptions(hop_s=options.hop_s),
                    restored=restored,
                    merges=restored_merges(options),
                )
            except ValueError as exc:
                raise InvalidRequest(f"bad live settings: {exc}") from exc
        self._sessions[session_id] = _Session(options, live)

    def append(self, session_id: str, samples: Samples) -> None:
        """Queue [n] float32 16 kHz samples. Raises NotFound for an unknown session, ProtocolError
        for audio after end, and for a live session BadAudio as `LiveSession.receive_audio`."""
        sess = self._get(session_id)
        if sess.ended:
            raise ProtocolError("audio after end")
        if sess.live is not None:
            sess.live.receive_audio(samples)
        else:
            sess.upload.append(np.asarray(samples, dtype=np.float32).reshape(-1))

    def finalize(self, session_id: str) -> None:
        sess = self._get(session_id)
        if sess.live is not None:
            sess.live.finalize()

    def merge_speakers(self, session_id: str, speaker: str, into: str) -> None:
        """A live session's merge (BackendCore); its revision, if one is due, maps through it
        too. Raises NotFound for an unknown session, ValueError as `SpeakerMerges.add`."""
        sess = self._get(session_id)
        if sess.live is not None:
            sess.live.merge_speakers(speaker, into)

    def end(self, session_id: str) -> None:
        """No more audio. Raises NotFound for an unknown session, ProtocolError for an end after
        end."""
        sess = self._get(session_id)
        if sess.ended:
            raise ProtocolError("end after end")
        sess.ended = True
        if sess.live is not None:
            sess.live.end()

    def abort(self, session_id: str) -> None:
        self._get(session_id)
        del self._sessions[session_id]

    def has_work(self) -> bool:
        return any(self._ready(s) for s in self._sessions.values())

    def stats(self) -> EngineStats | None:
        """None: a window re-decoder has no step engine to count."""
        return None

    def set_incoming_uploads(self, count: int) -> None:
        """Ignored: uploads are decoded a window per step, not batched, so none waits for others."""
        return None

    def is_holding(self) -> bool:
        """Never: nothing is held."""
        return False

    def step(self) -> list[tuple[str, Event]]:
        """Run one session's next piece of work (`_next_session` picks it: uploads oldest first,
        live sessions round-robin). A failure becomes that session's Error event (terminal: the
        session is forgotten) rather than an exception."""
        sid = self._next_session()
        if sid is None:
            return []
        sess = self._sessions[sid]
        if _offline(sess):
            self._num_live_steps = 0  # not moved: uploads are served oldest first
        else:
            self._sessions.move_to_end(sid)  # live sessions round-robin
            self._num_live_steps += 1
        try:
            events = self._run(sess)
        except LivemeetError as exc:
            events = [Error(exc.code, exc.message, exc.retryable)]
        except Exception as exc:  # one session's decode failure must not stop others
            log.exception("decode failed for session %s", sid)
            events = [Error("internal_error", f"decode failed: {unexpected_text(exc)}")]
        if events and is_terminal(events[-1]):
            del self._sessions[sid]
        return [(sid, e) for e in events]

    # -- internals ----------------------------------------------------------------------------

    def _get(self, session_id: str) -> _Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise NotFound(f"unknown session {session_id!r}") from None

    def _next_session(self) -> str | None:
        """The session the next step serves (module docstring): the first ready live session
        in round-robin order, unless an upload is ready and no hop is due or every live session
        with a hop due has had a step since the last upload window; None when nothing is
        ready. The upload is the oldest ready one: uploads run one after another, window by
        window (taking turns, K uploads would all finish near the end of the K-th)."""
        live: list[str] = []
        upload = None
        for sid, sess in self._sessions.items():
            if not self._ready(sess):
                continue
            if not _offline(sess):
                live.append(sid)
            elif upload is None:
                upload = sid
        if upload is not None and self._num_live_steps >= len(live):
            return upload
        return live[0] if live else None

    @staticmethod
    def _ready(sess: _Session) -> bool:
        if sess.live is None:
            return sess.ended
        if sess.revising is not None:
            return True
        return sess.live.hop_due() or sess.live.flush_due()

    def _prompt(self, options: SessionOptions, committed: str | None) -> str | None:
        parts = []
        if self.use_request_prompt:
            parts += [options.prompt or "", " ".join(options.hotwords)]
        if self.use_committed_prompt:
            parts.append(committed or "")
        prompt = " ".join(p for p in parts if p)
        return prompt or None

    def _run(self, sess: _Session) -> list[Event]:
        if sess.live is None:
            return self._run_upload(sess)
        if sess.revising is not None:
            return [self._revision(sess, sess.live, sess.revising)]
        live = sess.live
        if live.hop_due():
            win: Window = live.window()
            segs = self.transcribe_window(
                win.samples, win.offset_s, self._prompt(sess.options, win.prompt)
            )
            events = live.apply_hypothesis(segs)
        else:
            events = live.flush()
        if live.ended:
            revise = sess.options.revise and self.info.revise and live.edge_s > 0
            final = live.finish(revision=revise)
            sess.revising = final if revise else None
            events.append(final)
        return events

    def _revision(
        self, sess: _Session, live: LiveSession, final: TranscriptFinal
    ) -> TranscriptRevised:
        """The revision of a live session whose `final` is out (module docstring). Raises as
        `revise_meeting`."""
        decoded = self.revise_meeting(live.edge_s, self._prompt(sess.options, None))
        # the decoder's own times may run past the audio (a trial: 36.3 s on 35.05 s): clipped
        # to it and flagged END_CLAMPED, empty texts and loops cut, as a hop's hypothesis is
        segments = clean_hypothesis(decoded, 0.0, live.edge_s)
        mapped = map_revision(segments, final.segments, live.labels_seen, live.merges)
        return TranscriptRevised(
            revision_segments(mapped, final.segments), tuple(s.id for s in final.segments)
        )

    def _run_upload(self, sess: _Session) -> list[Event]:
        """One window of the upload (no events), or its events once every window is decoded."""
        job = sess.job
        if job is None:
            samples = np.concatenate(sess.upload) if sess.upload else np.zeros(0, np.float32)
            sess.upload = []
            prompt = self._prompt(sess.options, None)
            job = sess.job = _UploadJob(
                self.upload_pieces(samples, prompt), UploadTranscript(samples.size / SAMPLE_RATE)
            )
        piece = next(job.pieces, None)
        if piece is not None:
            return _finish_piece(job.transcript, piece)
        return [job.transcript.final(FinishReason.STOP)]


def _finish_piece(transcript: UploadTranscript, piece: Sequence[Segment]) -> list[Event]:
    """A decoded window's segments as finals, each with its TextDelta (what it adds to the
    joined text) and SegmentFinal: a streamed upload shows each window's text as it is
    decoded, not all of it after the last."""
    events: list[Event] = []
    for seg in piece:
        added = transcript.add(seg)
        if added is None:
            continue
        final, delta = added
        if delta:
            events.append(TextDelta(delta))
        events.append(SegmentFinal(final))
    return events
