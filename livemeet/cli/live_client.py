"""The live WebSocket client behind `livemeet stream` (livemeet/cli/stream.py is the command:
its flags, what it prints, its exit status): one live session over /v1/live (docs/protocol.md).

`stream_audio` sends 16 kHz mono audio to a live endpoint in hop-sized PCM16 frames (`frames`,
`to_pcm16`) paced in audio time (`speed` x real time), then `end`, and collects the server's
events until it closes (`StreamResult`). The audio is taken a chunk at a time as it is sent, so
an iterator that decodes a file holds a few MB whatever the file's length, plus the audio the
server has not acknowledged yet, kept for a resume (at most MAX_UNACKED_S: sending waits for an
ack past it). `stream_samples` is `stream_audio` of one array.

A connection lost without a close frame (a network blip: 1006, a reset), or closed by a server
that restarts and keeps the session (1012, `server_restarting`), does not lose the session
(`resumable_close`): the client reconnects (RECONNECT_FIRST_S, doubling to RECONNECT_MAX_S) for
as long as the server keeps it (`resume_deadline`), resumes it, sends the audio on from the
offset the server reports and skips the finals the resume replays (docs/protocol.md,
"Resume"). `SessionLink` is that bookkeeping, Sans-I/O: the session's resume token, the audio
not yet acknowledged (`UnackedAudio`), the places of the `finalize`s sent (`finalize_at_s`)
that the server may have lost with a crash, sent again at their places past the resume's
`finalize_offset`, the finals shown; `_Streamer` does the I/O. A refused resume (every other
close the server sends) ends the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import queue
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import websockets

from livemeet.audio.constants import LIVE_HOP_S, MAX_FRAME_BYTES, PCM_S16LE_BYTES, SAMPLE_RATE
from livemeet.errors import LivemeetError, RevisionFailed, ServerRestarting
from livemeet.gateway.live_protocol import SERVICE_RESTART
from livemeet.transcriber import Samples

CLOSE_TIMEOUT_S = 30.0  # s to wait for transcript.final after `end`, plus the audio's duration
# no close frame (1006: a reset, a timeout, an EOF; 1005: one without a code): the network, not
# the server, ended the connection, so the session waits for a resume (the recorder page does
# the same: livemeet/web/recorder.js)
# and 1012 (errors.ServerRestarting): the server restarts and its next start has the session
RESUMABLE_CLOSES = frozenset({1005, 1006, SERVICE_RESTART})
RECONNECT_FIRST_S = 0.25  # s before the first reconnect after a drop, doubling up to the max
RECONNECT_MAX_S = 5.0
# s after a drop that a server which cannot be reached (refused, timed out: restarting, or a
# model loading for minutes) is still waited for
RECONNECT_OUTAGE_MAX_S = 600.0


def resume_deadline(dropped_at: float, window_s: float, unreachable_at: float | None) -> float:
    """When to stop trying to resume (s, the monotonic clock of `dropped_at`): the server keeps
    a dropped session `window_s` from the drop; when it could not even be reached last time
    (at `unreachable_at`), it may be restarting, and a restarted server rebuilds its sessions
    and keeps them `window_s` from its start: the deadline is then a window past that attempt,
    at most RECONNECT_OUTAGE_MAX_S after the drop."""
    deadline = dropped_at + window_s
    if unreachable_at is not None:
        later = min(unreachable_at + window_s, dropped_at + RECONNECT_OUTAGE_MAX_S)
        deadline = max(deadline, later)
    return deadline


# s of audio sent and not yet acknowledged, at most, kept for a resume (~1 MB of PCM16): past
# it, sending waits for an ack, which comes within ACK_INTERVAL_S of the server reading audio
MAX_UNACKED_S = 30.0
# the text frame of a `finalize` (docs/protocol.md, Client to server)
FINALIZE_MESSAGE = json.dumps({"type": "finalize"})


@dataclass
class StreamResult:
    """Every server event with its arrival time (s since the first audio frame) and the
    close code."""

    events: list[dict[str, Any]] = field(default_factory=list)
    arrival_s: list[float] = field(default_factory=list)
    close_code: int | None = None
    timed_out: bool = False  # no close within the final timeout after `end`
    sent_s: float = 0.0  # s of audio sent: less than the file's when sending stopped early
    # sending stopped with audio left: the server closed, `stop` was set, or the audio failed
    stopped_early: bool = False
    interrupted: bool = False  # `stop` was set (Ctrl-C)
    audio_error: LivemeetError | None = None  # the audio failed to decode past `sent_s`
    num_resumes: int = 0  # dropped connections resumed
    # why the session was lost before its final: no resume in the window, a refused resume, a
    # resume the two sides disagree about
    failure: str | None = None
    # why it was lost after its final, waiting for the revision (the same causes; a server
    # restarted meanwhile no longer has it): the final stands, as after a revision that failed
    revision_lost: str | None = None

    @property
    def final(self) -> dict[str, Any] | None:
        """The `transcript.final` frame received, if any (docs/protocol.md, Server to client)."""
        return next((e for e in self.events if e["type"] == "transcript.final"), None)

    @property
    def revised(self) -> dict[str, Any] | None:
        """`transcript.revised`, where `session.ready` promised one and it came (DESIGN 5.7)."""
        return next((e for e in self.events if e["type"] == "transcript.revised"), None)

    @property
    def error(self) -> dict[str, Any] | None:
        """The first `error` frame received, if any (docs/protocol.md, Server to client)."""
        return next((e for e in self.events if e["type"] == "error"), None)

    @property
    def error_after_final(self) -> dict[str, Any] | None:
        """The `error` the server closed with after `transcript.final` (its revision's failure
        aside, which leaves the final standing): a session it ended itself, for its storage
        (storage_failed: the final may not be stored) or an idle client; None if none."""
        final = self.final
        if final is None:
            return None
        after = [e for e in self._after(final) if e["type"] == "error"]
        return next((e for e in after if e["code"] != RevisionFailed.code), None)

    @property
    def revision_pending(self) -> bool:
        """`transcript.final` came, a `session.ready` promised its revision, and neither the
        revision nor an error after the final did."""
        final = self.final
        if final is None or not any(e.get("revise") for e in self.events[: self._index(final)]):
            return False
        return not any(e["type"] in ("transcript.revised", "error") for e in self._after(final))

    def _index(self, event: dict[str, Any]) -> int:
        return next(i for i, e in enumerate(self.events) if e is event)

    def _after(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        return self.events[self._index(event) + 1 :]

    @property
    def refusal(self) -> dict[str, Any] | None:
        """The server's `error` when it refused to start the session (none came before any
        `session.ready`: not ready, at capacity, a low disk, a field it refuses), else None."""
        if any(e["type"] == "session.ready" for e in self.events):
            return None
        return self.error

    def shortfall(self, file_s: float, from_s: float = 0.0) -> str | None:
        """Why the final transcript does not cover the `file_s`-second file from `from_s` (s;
        where sending began: `stream --from-s`) to its end, or None: a server that shuts down
        with `--shutdown-live end` (or resume off) drains the session (ends it early, closes
        1001; protocol.md; a restart keeps it instead, resumed here), or Ctrl-C stopped the
        audio; the final covers only the audio the server had received then, and the rest was
        never sent. The place to resend from is given in the file's seconds."""
        final = self.final
        # the wire's durations are rounded to the ms (protocol.md): 30.0000625 s arrive as 30.0
        to_send_s = round(file_s - from_s, 3)
        if final is None or (not self.stopped_early and final["duration"] >= to_send_s):
            return None
        # shown floored to the hundredth, the place to resend from first: rounded, 6.375 s read
        # "resend from 6.38 s", and `stream --from-s 6.38` then skipped 5 ms nobody transcribed
        # (the 1e-6 keeps 0.29 s, 28.999... hundredths, from reading 0.28)
        covered_s = math.floor(100.0 * (from_s + float(final["duration"])) + 1e-6) / 100.0
        closing = self.error_after_final
        code = f"{closing['code']}, " if closing is not None else ""
        why = (
            "stopped by Ctrl-C"
            if self.interrupted
            else f"the server ended the session early ({code}close {self.close_code})"
        )
        # the final's duration is what the server read (protocol.md): frames sent past it may
        # have sat unread in socket buffers, so it, not `sent_s`, is where to resend from
        span = f"{from_s:.2f}-{covered_s:.2f} s" if from_s else f"{covered_s:.2f} s"
        return (
            f"{why}: the transcript covers {span} of the {file_s:.2f} s file; resend from "
            f"{covered_s:.2f} s (stream --from-s {covered_s:.2f}; the last "
            f"{max(0.0, file_s - covered_s):.2f} s are not transcribed; {self.sent_s:.2f} s "
            "had been sent)"
        )


def to_pcm16(samples: Samples) -> bytes:
    """float32 [-1, 1] -> PCM16 LE bytes."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def frames(chunks: Iterable[Samples], frame_samples: int) -> Iterator[Samples]:
    """`chunks` regrouped into frames of `frame_samples` (the last may be shorter): the frames
    their concatenation would be cut into, taking a chunk only when a frame needs it, so at
    most a frame and a chunk are held. When `chunks` raises (a file damaged mid-way), the
    samples it gave before are yielded first, then the error."""
    pending: list[Samples] = []
    num_pending = 0
    try:
        for chunk in chunks:
            pending.append(chunk)
            num_pending += chunk.size
            if num_pending < frame_samples:
                continue
            joined = np.concatenate(pending)  # [num_pending]
            num_whole = num_pending - num_pending % frame_samples
            for offset in range(0, num_whole, frame_samples):
                yield joined[offset : offset + frame_samples]
            pending = [joined[num_whole:]]
            num_pending -= num_whole
    except Exception:
        if num_pending:  # decoded before the error: genuine audio, sent before it is raised
            yield np.concatenate(pending)
        raise
    if num_pending:
        yield np.concatenate(pending)


class ResumeMismatch(Exception):
    """A resumed session's `offset` is outside the audio this client holds (before its oldest
    unacknowledged frame, or past what it sent), or a resume started a new session: the two
    sides disagree about the session's audio, a bug on one of them. Nothing is resent."""


class UnackedAudio:
    """The PCM16 frames sent and not yet acknowledged (`audio.ack`), by offset: sample frames
    from the session's start. A frame is released once an ack covers all of it; every frame
    sent after the last ack is kept, so a resume may restart anywhere from that ack to the end
    of what was sent (docs/protocol.md, "Resume")."""

    def __init__(self) -> None:
        # (offset, PCM16): contiguous, oldest first
        self._frames: deque[tuple[int, bytes]] = deque()
        self.num_sent = 0  # sample frames pushed: the offset of the next
        self.num_acked = 0  # the highest ack's offset

    @property
    def num_held(self) -> int:
        """Sample frames held: sent and not yet covered by an ack."""
        return self.num_sent - self._frames[0][0] if self._frames else 0

    def push(self, pcm: bytes) -> None:
        """Hold `pcm` (PCM16 LE, whole sample frames), just sent, at the next offset."""
        self._frames.append((self.num_sent, pcm))
        self.num_sent += len(pcm) // PCM_S16LE_BYTES

    def ack(self, offset: int) -> None:
        """The server holds the audio before `offset` (sample frames): release the frames it
        covers whole. Offsets only grow: an older ack changes nothing."""
        self.num_acked = max(self.num_acked, offset)
        while self._frames:
            start, pcm = self._frames[0]
            if start + len(pcm) // PCM_S16LE_BYTES > self.num_acked:
                break
            self._frames.popleft()

    def since(self, offset: int) -> list[bytes]:
        """The PCM16 that carries the audio from `offset` on (the first frame cut there).
        Raises ResumeMismatch for an offset before the oldest frame held or past the last."""
        oldest = self._frames[0][0] if self._frames else self.num_sent
        if not oldest <= offset <= self.num_sent:
            raise ResumeMismatch(
                f"the server resumed the session at sample frame {offset}, but this client "
                f"holds frames {oldest} to {self.num_sent} (acknowledged up to "
                f"{self.num_acked}): the two sides disagree about its audio"
            )
        out: list[bytes] = []
        for start, pcm in self._frames:
            skip = max(0, offset - start) * PCM_S16LE_BYTES
            if skip < len(pcm):
                out.append(pcm[skip:] if skip else pcm)
        return out


class SessionLink:
    """What `stream` keeps to resume its live session after a dropped connection
    (docs/protocol.md, "Resume"): the session's id and token from `session.ready`, the audio
    the server has not acknowledged, and the ids of the finals shown, since a resume replays
    them all. Sans-I/O: it takes the server's events and says what to show and what to send.

    Until a `session.ready` says whether the server keeps sessions, the audio sent is kept;
    `can_send` turns false while `max_unacked_frames` of it wait for an ack (the file waits,
    unlike a microphone), and is always true once the server said resume is off."""

    def __init__(self, max_unacked_frames: int) -> None:
        self.max_unacked_frames = max_unacked_frames
        self.unacked = UnackedAudio()
        # the places (sample frames sent before each, as `offset` counts) of the finalizes
        # sent that no `session.ready` has said the server holds on disk, increasing: a
        # crash may have taken them, acknowledged audio before them or not, so a resume
        # sends them again (`resumed`)
        self.finalizes: list[int] = []
        self.resume: dict[str, str] | None = None  # `start`'s `resume` field, once known
        self.window_s = 0.0  # s the server keeps the session after its socket goes
        self.resume_off = False  # the server keeps no session: nothing is kept here either
        self._final_ids: set[str] = set()
        self._final_seen = False  # transcript.final came: a resume for its revision replays it

    @property
    def can_send(self) -> bool:
        """Whether another frame may go out now (see the class docstring)."""
        return self.resume_off or self.unacked.num_held < self.max_unacked_frames

    def sent(self, pcm: bytes) -> None:
        """`pcm` (PCM16 LE) went out: held until acknowledged, unless resume is off."""
        if not self.resume_off:
            self.unacked.push(pcm)

    def finalized(self) -> None:
        """A `finalize` goes out after the audio `sent` so far (kept before it is sent, as a
        frame is): its place is held until a resume's `session.ready` says the server holds
        it, unless resume is off. A second one with no audio between is the same place."""
        place = self.unacked.num_sent
        if not self.resume_off and (not self.finalizes or self.finalizes[-1] != place):
            self.finalizes.append(place)

    def receive(self, event: dict[str, Any]) -> bool:
        """Take in one server event; whether to show it: not an ack (flow control, not
        news), not a final (nor `transcript.final`) that a resume replays."""
        kind = event.get("type")
        if kind == "audio.ack":
            self.unacked.ack(int(event["offset"]))
            return False
        if kind == "session.ready" and not event.get("resumed"):
            token = event.get("resume_token")  # null (or absent: an older server): resume off
            if token:
                self.resume = {"session_id": event["session_id"], "resume_token": token}
                self.window_s = float(event.get("resume_window_s") or 0.0)
            else:
                self.resume_off = True
                self.unacked = UnackedAudio()
        if kind == "segment.final":
            if event["id"] in self._final_ids:
                return False
            self._final_ids.add(event["id"])
        if kind == "transcript.final":
            if self._final_seen:
                return False
            self._final_seen = True
        return True

    def resumed(self, ready: dict[str, Any]) -> list[bytes | str]:
        """The frames to send again after the `session.ready` that answered a resume, in
        order: the audio from its `offset` on (PCM16, binary), with a `finalize` (text) at
        the place of each one sent past its `finalize_offset` (docs/protocol.md, Resume):
        after the frame that ends there (a frame it falls within is split there), or first
        where it is at `offset`. Those at or before `finalize_offset` are held by the server
        and forgotten here; the others are kept (a crash may take them again). A server
        whose `session.ready` has no `finalize_offset` (older than it) gets none: it would
        take one it holds already for a new cut. Raises ResumeMismatch when it did not
        resume, or resumed at an offset outside what is held."""
        if not ready.get("resumed"):
            raise ResumeMismatch(
                f"asked to resume session {ready.get('session_id')!r}, the server started a "
                "new one instead"
            )
        offset = int(ready["offset"])
        pcm = self.unacked.since(offset)
        self.unacked.ack(offset)  # the session holds it
        if "finalize_offset" not in ready:
            self.finalizes = []
            return list(pcm)
        held = ready["finalize_offset"]
        if held is not None:
            self.finalizes = [place for place in self.finalizes if place > int(held)]
        return with_finalizes(pcm, offset, self.finalizes)


def with_finalizes(pcm: list[bytes], offset: int, places: list[int]) -> list[bytes | str]:
    """`pcm` (mono PCM16 frames, contiguous from sample frame `offset` on) with a `finalize`
    text frame at each of `places` (sample frames, increasing): first for one at or before
    `offset`, after the frame that ends at one, a frame one falls within split there, and
    last for one at the end of `pcm` (or past it)."""
    out: list[bytes | str] = []
    pending = deque(places)
    at = offset
    for frame in pcm:
        while pending and pending[0] < at + len(frame) // PCM_S16LE_BYTES:
            cut = max(0, pending.popleft() - at)
            if cut:
                out.append(frame[: cut * PCM_S16LE_BYTES])
                frame, at = frame[cut * PCM_S16LE_BYTES :], at + cut
            out.append(FINALIZE_MESSAGE)
        if frame:
            out.append(frame)
            at += len(frame) // PCM_S16LE_BYTES
    out += [FINALIZE_MESSAGE] * len(pending)
    return out


class PipeFrames:
    """Frames pulled from an iterator whose `next` may wait long (audio decoded from a pipe as
    its writer records it: `livemeet stream -`) on a daemon thread, one per `pull`, so the event
    loop reads the server's events meanwhile (pulled on the loop, each wait for a hop of audio
    held back the events for as long). A daemon: a pull waiting on a silent pipe never keeps
    the process from exiting. Once `pull` was given up on (cancelled: Ctrl-C), the iterator
    may still be running on the thread: its owner must not close it."""

    def __init__(self, frames: Iterator[Samples]) -> None:
        self._frames = frames
        # a pull's future, and the loop to settle it on; None stops the thread
        self._requests: queue.SimpleQueue[
            tuple[asyncio.Future[Samples | None], asyncio.AbstractEventLoop] | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="livemeet-pipe", daemon=True)
        self._thread.start()

    def pull(self) -> asyncio.Future[Samples | None]:
        """The next frame, to await: None when the frames ran out; it raises what the iterator
        raised. Cancel it to give up on it (the thread's read goes on, its frame is dropped)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Samples | None] = loop.create_future()
        self._requests.put((future, loop))
        return future

    def stop(self) -> None:
        """End the thread once its pull in progress, if any, returns."""
        self._requests.put(None)

    def _serve(self) -> None:
        while (request := self._requests.get()) is not None:
            future, loop = request
            try:
                outcome: tuple[Samples | None, BaseException | None] = (
                    next(self._frames, None),
                    None,
                )
            except Exception as exc:  # handed to the awaiting task, raised there
                outcome = (None, exc)
            with contextlib.suppress(RuntimeError):  # the loop closed while it waited
                loop.call_soon_threadsafe(_settle, future, outcome)


def _settle(
    future: asyncio.Future[Samples | None], outcome: tuple[Samples | None, BaseException | None]
) -> None:
    if future.done():  # given up on (cancelled)
        return
    frame, error = outcome
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(frame)


def resumable_close(code: int | None) -> bool:
    """Whether a connection that closed with `code` left its session for a resume: no close
    frame came (1006, a reset, a timeout; 1005: a close frame without a code: the network), or
    the server restarts and keeps it (1012, `server_restarting`). Every other code the server
    sends (1000 after the final, 1001 drained, 44xx/45xx with an error: not_found,
    unauthorized, session_taken_over, ...) ends it for good."""
    return code in RESUMABLE_CLOSES


async def stream_samples(url: str, samples: Samples, **kwargs: Any) -> StreamResult:
    """`stream_audio` of one array of samples (the tests; the load test sends its own frames
    to time each one)."""
    return await stream_audio(url, [samples], **kwargs)


async def stream_audio(
    url: str,
    chunks: Iterable[Samples],
    *,
    hop_s: float = LIVE_HOP_S,
    speed: float = 1.0,
    start: dict[str, Any] | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    final_timeout_s: float | None = None,
    stop: asyncio.Event | None = None,
    api_key: str | None = None,
    wait_revision: bool = True,
    ssl_context: ssl.SSLContext | None = None,
    from_pipe: bool = False,
    finalize_at_s: Iterable[float] = (),
) -> StreamResult:
    """Stream 16 kHz mono float32 `chunks` (any sizes; taken as they are needed, so an
    iterator that decodes a file holds a chunk at a time; `from_pipe`: taken on a thread, for
    an iterator that waits on a pipe's writer, `PipeFrames`) to `url`, paced at `speed` x real
    time in frames of `hop_s` seconds; then `end`, and collect events until the server closes.
    `on_event` gets each event as it comes, except `audio.ack`s and replayed finals;
    `on_notice` a line on each reconnect. `api_key` goes on every upgrade request as
    `Authorization: Bearer`; `ssl_context` (`stream.client_ssl_context`), where given, checks a
    wss:// server's certificate. Where `session.ready` promised a revision, the events go on to
    `transcript.revised` (or its error) unless not `wait_revision`: then the connection is
    closed (1000) once `transcript.final` came. `finalize_at_s`: places in the audio (s from
    its start, at 1/SAMPLE_RATE s) where a `finalize` goes out, after the audio before it (a
    push-to-talk release's, say); one past the audio's end is not sent (`end` commits all).

    Sending stops early when the server closes, when `stop` is set (Ctrl-C: `end` then still
    goes out and the final is awaited) or when `chunks` raises a LivemeetError (the file is
    damaged past that point: `result.audio_error`, and the audio before it is ended as by
    `stop`). A connection lost without a close frame is resumed (docs/protocol.md, "Resume")
    for as long as the server keeps the session: from the offset the server reports, out of
    the audio kept since its last ack, with each finalize the server may have lost again at
    its place (`SessionLink.resumed`). After `end` it waits `final_timeout_s` (default:
    CLOSE_TIMEOUT_S + the audio's duration, since a loaded server may still be catching up)
    and then gives up with `result.timed_out`. Raises ValueError for a place in
    `finalize_at_s` before the audio's start, OSError / websockets errors when it cannot
    connect at first."""
    places = sorted(round(s * SAMPLE_RATE) for s in finalize_at_s)
    if places and places[0] < 0:
        raise ValueError(f"a finalize at {places[0] / SAMPLE_RATE} s is before the audio's start")
    # a hop's samples, in frames the server accepts (a hop of more than ~32 s is several)
    frame_samples = min(max(1, int(hop_s * SAMPLE_RATE)), MAX_FRAME_BYTES // PCM_S16LE_BYTES)
    framed = frames(chunks, frame_samples)
    streamer = _Streamer(
        url,
        PipeFrames(framed) if from_pipe else framed,
        speed=speed,
        start=start or {},
        on_event=on_event,
        on_notice=on_notice,
        final_timeout_s=final_timeout_s,
        stop=stop or asyncio.Event(),
        api_key=api_key,
        wait_revision=wait_revision,
        ssl_context=ssl_context,
        finalize_at=places,
    )
    try:
        return await streamer.run()
    finally:
        if isinstance(streamer.frames, PipeFrames):
            streamer.frames.stop()


class _Streamer:
    """One `stream_audio`: its connections (the first, then a resume after each drop), the
    sender and the receiver of each."""

    def __init__(
        self,
        url: str,
        frames: Iterator[Samples] | PipeFrames,
        *,
        speed: float,
        start: dict[str, Any],
        on_event: Callable[[dict[str, Any]], None] | None,
        on_notice: Callable[[str], None] | None,
        final_timeout_s: float | None,
        stop: asyncio.Event,
        api_key: str | None = None,
        wait_revision: bool = True,
        ssl_context: ssl.SSLContext | None = None,
        finalize_at: Iterable[int] = (),
    ) -> None:
        self.url = url
        self.wait_revision = wait_revision
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # websockets refuses ssl=None for a wss:// URL: absent, it makes its default context
        self.tls: dict[str, Any] = {} if ssl_context is None else {"ssl": ssl_context}
        self.frames = frames
        self.speed = speed
        self.start = {
            "type": "start",
            "sample_rate": SAMPLE_RATE,
            "channels": 1,
            "encoding": "pcm_s16le",
            **start,
        }
        self.on_event = on_event
        self.on_notice = on_notice
        self.final_timeout_s = final_timeout_s
        self.stop = stop
        self.result = StreamResult()
        self.link = SessionLink(int(MAX_UNACKED_S * SAMPLE_RATE))
        self.changed = asyncio.Event()  # set on each server event: a sender waits on it
        self.ready: dict[str, Any] | None = None  # this connection's `session.ready`
        self.t0 = 0.0  # monotonic s the first connection opened: events' arrival clock
        self.pace_t0: float | None = None  # monotonic s of the first frame: the pacing clock
        self.num_samples_sent = 0
        # the places (samples of audio before each, increasing) of the finalizes still to send
        self.finalize_at = deque(finalize_at)
        self.exhausted = False  # the frames ran out (or failed: `result.audio_error`)
        self.ending = False  # no more audio: `end` goes out (again, after a resume)
        self.dropped_at: float | None = None  # monotonic s the connection dropped, until resumed
        self.unreachable_at: float | None = None  # the last attempt that found no server
        self.num_retries = 0  # reconnects since the drop
        # a pipe's frame read on its thread and not yet sent: a connection that closed
        # while it was awaited leaves it to the next (a resume)
        self.pending_pull: asyncio.Future[Samples | None] | None = None

    async def run(self) -> StreamResult:
        ws = await self._connect()
        self.t0 = time.monotonic()
        resuming = False
        while True:
            await self._carry(ws, resuming)
            if not self._should_resume(ws.close_code):
                break
            resuming = True
            reconnected = await self._reconnect(ws.close_code)
            if reconnected is None:
                break
            ws = reconnected
        self.result.stopped_early = not self.exhausted or self.result.audio_error is not None
        return self.result

    async def _carry(self, ws: websockets.ClientConnection, resuming: bool) -> None:
        """Run one connection until it closes: `start` (a resume after a drop), the audio
        from where the session is, `end`, the events."""
        self.ready = None
        start = {**self.start, "resume": self.link.resume} if resuming else self.start
        async with ws:
            receiver = asyncio.create_task(self._receive(ws))
            try:
                await ws.send(json.dumps(start))
                # a resume that closes before its `session.ready` was refused, or dropped again
                if not resuming or await self._resend(ws, receiver):
                    await self._send_audio(ws, receiver)
                    await self._end(ws, receiver)
            except ResumeMismatch as exc:
                self.result.failure = str(exc)
                await ws.close()
            except TimeoutError:
                # an OSError: caught here so that it never reads as "cannot connect"
                self.result.timed_out = True
            except websockets.ConnectionClosed:
                pass  # the close code says whether to resume
            finally:
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)
        self.result.close_code = ws.close_code
        if resuming and self.ready is None and not resumable_close(ws.close_code):
            error = self.result.error or {"code": "closed", "message": "no session.ready"}
            self._lose(
                f"the session could not be resumed after the connection dropped: "
                f"{error['code']}: {error['message']} (close {ws.close_code})"
            )

    def _lose(self, why: str) -> None:
        """The session is lost (`why`): the stream failed, or, once its final came (a drop
        while waiting for the revision), only the revision is lost: a server killed during
        the revision keeps the final alone, and the final stands (a crash trial: `stream`
        exited 1 with the final in hand)."""
        if self.result.final is not None:
            self.result.revision_lost = why
        else:
            self.result.failure = why

    async def _receive(self, ws: websockets.ClientConnection) -> None:
        async for message in ws:
            event = json.loads(message)
            if event.get("type") == "session.ready":
                self.ready = event
            restarting = event.get("type") == "error" and event["code"] == ServerRestarting.code
            if restarting and self.link.resume is not None:
                # not the session's end: its 1012 close is resumed (`_reconnect`); the message
                # says the server is restarting itself (ws_live.py), so it goes as it came
                self._notice(str(event.get("message") or "the server is restarting"))
                continue
            if self.link.receive(event):
                self.result.events.append(event)
                self.result.arrival_s.append(time.monotonic() - self.t0)
                if self.on_event is not None:
                    self.on_event(event)
            self.changed.set()
            if event.get("type") == "transcript.final" and not self.wait_revision:
                if self.result.revision_pending:
                    # `_carry` closes the connection (1000): the server keeps the revision. An
                    # error the server closes with after the revision (storage_failed) goes
                    # unread: it may be up to LIVE_REVISE_TIMEOUT_S away (stream.py says so)
                    return
                # none to wait for: the server closes, maybe with an error first (storage_failed:
                # whether the final was stored), which closing here left unread

    async def _wait_for(self, condition: Callable[[], bool], receiver: asyncio.Task[None]) -> bool:
        """Wait until `condition()` holds or the connection closes (`receiver` is done),
        looking again on each server event and on `stop`; whether it holds."""
        while not condition() and not receiver.done():
            self.changed.clear()
            wakers = {asyncio.ensure_future(self.changed.wait())}
            if not self.stop.is_set():
                wakers.add(asyncio.ensure_future(self.stop.wait()))
            await asyncio.wait({*wakers, receiver}, return_when=asyncio.FIRST_COMPLETED)
            for waker in wakers:
                waker.cancel()
        return condition()

    async def _resend(self, ws: websockets.ClientConnection, receiver: asyncio.Task[None]) -> bool:
        """After a resume's `start`: wait for `session.ready`, then send again the audio the
        session lacks, and the finalizes it may lack, at once (the pacing clock catches up).
        False when the connection closed first."""
        if not await self._wait_for(lambda: self.ready is not None, receiver):
            return False
        assert self.ready is not None
        again = self.link.resumed(self.ready)
        self.dropped_at, self.unreachable_at, self.num_retries = None, None, 0
        self.result.num_resumes += 1
        for data in again:
            await ws.send(data)  # binary: audio; text: a finalize
        return True

    async def _send_audio(
        self, ws: websockets.ClientConnection, receiver: asyncio.Task[None]
    ) -> None:
        """Send the frames paced at `speed` x real time (from the first frame), with the
        finalizes due among them, until they run out, `stop` is set or the audio fails (then
        `ending`), or the connection closes. A frame (and a finalize) is kept for a resume
        before it is sent: one the connection lost goes again."""
        while not self.ending:
            if not await self._wait_for(lambda: self.link.can_send or self.stop.is_set(), receiver):
                return  # closed while the unacknowledged audio was at its bound
            if receiver.done() or not await self._pipe_ready(receiver):
                return  # the server closed (error, drain) or the connection dropped
            frame = self._next_frame()
            if frame is None:
                return
            # all of it kept first: a drop between its pieces loses none of them
            outgoing = self._outgoing(frame)
            self.result.sent_s = self.num_samples_sent / SAMPLE_RATE
            for data in outgoing:
                await ws.send(data)
            await self._pace()

    def _outgoing(self, frame: Samples) -> list[bytes | str]:
        """`frame` as PCM16 (binary), with a `finalize` (text) at each place of `finalize_at`
        it reaches, the frame split there (one at its end goes right after it, not a paced
        frame later), each kept by the link as it will go out."""
        outgoing: list[bytes | str] = []
        while self.finalize_at and self.finalize_at[0] <= self.num_samples_sent + frame.size:
            cut = max(0, self.finalize_at.popleft() - self.num_samples_sent)
            if cut:
                outgoing.append(self._take(frame[:cut]))
                frame = frame[cut:]
            self.link.finalized()
            outgoing.append(FINALIZE_MESSAGE)
        if frame.size:
            outgoing.append(self._take(frame))
        return outgoing

    def _take(self, samples: Samples) -> bytes:
        """`samples` as PCM16, counted as sent and kept by the link."""
        # PCM16 frame by frame: the whole file at once took ~385 MB more an hour of audio
        pcm = to_pcm16(samples)
        self.link.sent(pcm)
        self.num_samples_sent += samples.size
        return pcm

    def _next_frame(self) -> Samples | None:
        """The next frame to send, or None (and `ending`) when the audio ran out or failed,
        or `stop` was set (also while a pipe's frame was awaited: its writer may go on)."""
        try:
            frame = self._pull()
        except LivemeetError as exc:
            self.result.audio_error = exc
            frame = None
        # a pipe's pull given up on for `stop` is not the audio's end (`_pull`)
        self.exhausted = frame is None and not (
            isinstance(self.frames, PipeFrames) and self.stop.is_set()
        )
        if frame is None or self.stop.is_set():
            self.ending = True
            self.result.interrupted = self.stop.is_set()
            return None
        return frame

    async def _pipe_ready(self, receiver: asyncio.Task[None]) -> bool:
        """For a pipe: wait until its next frame is read or `stop` is set (True), or the
        connection closes first (False: the read goes on, for the next connection). A quiet
        pipe otherwise held the sender past a server's close (its error, a restart to
        resume from within its window) until the writer wrote again. True for a file."""
        if not isinstance(self.frames, PipeFrames) or self.stop.is_set():
            return True
        if self.pending_pull is None:
            self.pending_pull = self.frames.pull()
        stopped = asyncio.ensure_future(self.stop.wait())
        waiters: set[asyncio.Future[Any]] = {self.pending_pull, stopped, receiver}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        return self.pending_pull.done() or self.stop.is_set()

    def _pull(self) -> Samples | None:
        """The next frame: the iterator's, or the one `_pipe_ready` read from the pipe (None
        where `stop` came first: a frame it was reading is not sent). Raises what the
        iterator raised."""
        if not isinstance(self.frames, PipeFrames):
            return next(self.frames, None)
        pull, self.pending_pull = self.pending_pull, None
        if self.stop.is_set():
            if pull is not None:
                pull.cancel()  # the thread's read goes on; its frame is dropped
            return None
        assert pull is not None and pull.done(), "_pipe_ready reads a pipe's frame first"
        return pull.result()

    async def _pace(self) -> None:
        if self.pace_t0 is None:
            self.pace_t0 = time.monotonic()
        delay_s = self.pace_t0 + self.result.sent_s / self.speed - time.monotonic()
        with contextlib.suppress(TimeoutError):  # the pacing wait, cut short by `stop`
            await asyncio.wait_for(self.stop.wait(), max(0.0, delay_s))

    async def _end(self, ws: websockets.ClientConnection, receiver: asyncio.Task[None]) -> None:
        """Send `end` (again, on a resumed connection: the first may have been lost with the
        drop; the server ignores a second) and wait for the final and the close."""
        if receiver.done():
            pass  # the server closed (error, drain) before all audio was sent
        elif self.result.sent_s > 0:
            await ws.send(json.dumps({"type": "end"}))
        else:  # stopped before any audio: `end` would be a protocol error, and no final
            await ws.close()
        timeout_s = self.final_timeout_s
        if timeout_s is None:
            timeout_s = CLOSE_TIMEOUT_S + self.result.sent_s
        await asyncio.wait_for(asyncio.shield(receiver), timeout_s)

    def _should_resume(self, close_code: int | None) -> bool:
        result = self.result
        # a drop between the final and its revision is resumed for the revision
        finished = result.error is not None or (
            result.final is not None and not (self.wait_revision and result.revision_pending)
        )
        failed = result.timed_out or result.failure is not None or result.revision_lost is not None
        return (
            self.link.resume is not None
            and resumable_close(close_code)
            and not finished
            and not failed
        )

    async def _reconnect(self, close_code: int | None) -> websockets.ClientConnection | None:
        """A new connection for the resume, tried with backoff while the server still keeps
        the session (its window, counted from the drop); None once it has passed."""
        if self.dropped_at is None:
            self.dropped_at = time.monotonic()
        why = f"connection lost (close {close_code})"
        if close_code == SERVICE_RESTART:  # down until its next start: an unreachable server's
            self.unreachable_at = time.monotonic()
            why = f"the server is restarting (close {close_code})"
        while True:
            delay_s = min(RECONNECT_MAX_S, RECONNECT_FIRST_S * 2**self.num_retries)
            # the server's window runs from its own notice of the drop, about the same moment
            window_s = self.link.window_s
            deadline = resume_deadline(self.dropped_at, window_s, self.unreachable_at)
            if time.monotonic() + delay_s >= deadline:
                lost = f"{why}; not resumed within the {window_s:g} s the server "
                if self.unreachable_at is None:
                    lost += "keeps the session"
                else:
                    lost += (
                        "keeps the session, from the drop or from its restart: it could not "
                        "be reached (its transcript may still be stored at the URL above)"
                    )
                self._lose(lost)
                return None
            self.num_retries += 1
            self._notice(f"{why}: resuming in {delay_s:.2f} s")
            await asyncio.sleep(delay_s)
            try:
                return await self._connect()
            except OSError as exc:  # refused, timed out: no server there (yet)
                why = f"cannot reconnect ({exc})"
                self.unreachable_at = time.monotonic()
            except websockets.InvalidHandshake as exc:
                why = f"cannot reconnect ({exc})"

    async def _connect(self) -> websockets.ClientConnection:
        return await websockets.connect(
            self.url, max_size=None, close_timeout=5, additional_headers=self.headers, **self.tls
        )

    def _notice(self, line: str) -> None:
        if self.on_notice is not None:
            self.on_notice(line)
