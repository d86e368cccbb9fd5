"""`livemeet stream FILE [--url ws://HOST:PORT/v1/live]`: stream a file to a running server as a
live session (by default this machine's `livemeet serve`, ws://127.0.0.1:8000/v1/live).

Audio goes out in hop-sized PCM16 frames paced in audio time: real time by default, `--fast`
(or `--speed X`) divides every wait, so the server still sees a growing stream and sends
partials. Events are printed as they arrive.

A live session has no length limit, so neither has `stream`: the file is decoded as it is
sent, a block at a time, so its memory stays a few MB whatever the file's length (a whole
decode would hold ~230 MB an hour of audio).

Ctrl-C stops sending, sends `end` and still waits for the final transcript of what was sent
(the server drops the session of a client that just leaves, and its transcript with it); a
second Ctrl-C quits at once. Exit status: 0 for a final covering the whole file, 1 for no final
or one that covers part of it (it says from which second to resend), 2 when it could not run,
130 after Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import signal
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import websockets

from livemeet.audio.constants import LIVE_HOP_S, MAX_FRAME_BYTES, PCM_S16LE_BYTES, SAMPLE_RATE
from livemeet.cli.request_text import add_request_text_flags, check_request_text
from livemeet.errors import InvalidRequest, LivemeetError
from livemeet.gateway.live_protocol import LIVE_PATH
from livemeet.transcriber import Samples

FAST_SPEED = 4.0  # x real time for --fast
DEFAULT_URL = f"ws://127.0.0.1:8000{LIVE_PATH}"  # `livemeet serve` on its defaults
CLOSE_TIMEOUT_S = 30.0  # s to wait for transcript.final after `end`, plus the audio's duration
INTERRUPTED_STATUS = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
# --url schemes: a ws/wss URL is the endpoint; an http/https one the server (its page's address)
_WS_SCHEMES = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "stream", help="stream an audio file to a live session", description=__doc__
    )
    p.add_argument("file", type=Path, help="audio file (any format FFmpeg reads), of any length")
    p.add_argument(
        "--url",
        default=DEFAULT_URL,
        help=f"the server's live endpoint (default %(default)s): a ws:// or wss:// URL is used "
        f"as given, except that one without a path gets {LIVE_PATH}; an http:// or https:// "
        f"URL is the server's address (its page's): it becomes ws:// or wss:// and gets "
        f"{LIVE_PATH} after its path (https://host/prefix/ -> wss://host/prefix{LIVE_PATH}) "
        "unless the path ends in it. A query string is kept",
    )
    p.add_argument(
        "--fast", action="store_true", help=f"send at {FAST_SPEED:g}x real time (default: off)"
    )
    p.add_argument(
        "--speed",
        type=float,
        default=None,
        help=f"send at this multiple of real time (default: 1, or {FAST_SPEED:g} with --fast)",
    )
    p.add_argument(
        "--hop-s",
        type=float,
        default=LIVE_HOP_S,
        help="seconds of audio per frame sent (default %(default)g)",
    )
    add_request_text_flags(p, language_help="sent in `start`; MOSS-TD does not use it")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the server's events as raw JSON, one a line (default: one readable line each)",
    )
    p.set_defaults(func=run)


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

    @property
    def final(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e["type"] == "transcript.final"), None)

    @property
    def error(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e["type"] == "error"), None)

    def shortfall(self, file_s: float) -> str | None:
        """Why the final transcript does not cover all `file_s` seconds of the file, or None:
        a server that shuts down drains the session (ends it early, closes 1001; protocol.md),
        or Ctrl-C stopped the audio; the final covers only the audio the server had received
        then, and the rest was never sent."""
        final = self.final
        # the wire's durations are rounded to the ms (protocol.md): 30.0000625 s arrive as 30.0
        if final is None or (not self.stopped_early and final["duration"] >= round(file_s, 3)):
            return None
        covered_s = float(final["duration"])
        why = (
            "stopped by Ctrl-C"
            if self.interrupted
            else f"the server ended the session early (close {self.close_code})"
        )
        # the final's duration is what the server read (protocol.md): frames sent past it may
        # have sat unread in socket buffers, so it, not `sent_s`, is where to resend from
        return (
            f"{why}: the transcript covers {covered_s:.2f} s of the {file_s:.2f} s file; "
            f"resend from {covered_s:.2f} s (the last {max(0.0, file_s - covered_s):.2f} s are "
            f"not transcribed; {self.sent_s:.2f} s had been sent)"
        )


def live_url(url: str) -> str:
    """The live endpoint `url` names (see --url's help). A ws/wss URL is taken as given, so a
    proxy may serve the endpoint at any path, `/` included; only a bare `ws://host:8000` gets
    LIVE_PATH (a WebSocket URL needs a path; the server's root is its web page, which the client
    reported only as "server rejected WebSocket connection: HTTP 200": a user trial). An
    http/https URL is the address of the server's page, as a browser shows it, never an endpoint.
    Raises InvalidRequest for another scheme, no host or a fragment."""
    parts = urllib.parse.urlsplit(url)
    scheme = _WS_SCHEMES.get(parts.scheme.lower())
    if scheme is None or not parts.hostname:
        raise InvalidRequest(
            f"--url {url!r} is not a ws://, wss://, http:// or https:// URL with a host",
            param="url",
        )
    if parts.fragment:  # RFC 6455 section 3: a WebSocket URI has none
        raise InvalidRequest(f"--url {url!r} has a #fragment, which WebSocket URLs cannot have")
    path = parts.path
    if scheme != parts.scheme.lower():  # http/https: the server's address
        if not path.rstrip("/").endswith(LIVE_PATH):
            path = path.rstrip("/") + LIVE_PATH
    elif path == "":
        path = LIVE_PATH
    return urllib.parse.urlunsplit(parts._replace(scheme=scheme, path=path))


def wrong_path_hint(url: str) -> str:
    """What to tell a user whose `url` got an HTTP answer instead of a WebSocket: most likely
    the server's page at `ws://host:8000/`, which --url takes as given."""
    parts = urllib.parse.urlsplit(url)
    if parts.path.endswith(LIVE_PATH):
        return f"is it a livemeet server's {LIVE_PATH}?"
    suggested = urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + LIVE_PATH))
    return f"a ws:// URL is used as given: did you mean {suggested}?"


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


async def stream_samples(url: str, samples: Samples, **kwargs: Any) -> StreamResult:
    """`stream_audio` of one array of samples (tests, the load test)."""
    return await stream_audio(url, [samples], **kwargs)


async def stream_audio(
    url: str,
    chunks: Iterable[Samples],
    *,
    hop_s: float = LIVE_HOP_S,
    speed: float = 1.0,
    start: dict[str, Any] | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    final_timeout_s: float | None = None,
    stop: asyncio.Event | None = None,
) -> StreamResult:
    """Stream 16 kHz mono float32 `chunks` (any sizes; taken as they are needed, so an
    iterator that decodes a file holds a chunk at a time) to `url`, paced at `speed` x real
    time in frames of `hop_s` seconds; then `end`, and collect events until the server closes.

    Sending stops early when the server closes, when `stop` is set (Ctrl-C: `end` then still
    goes out and the final is awaited) or when `chunks` raises a LivemeetError (the file is
    damaged past that point: `result.audio_error`, and the audio before it is ended as by
    `stop`). After `end` it waits `final_timeout_s` (default: CLOSE_TIMEOUT_S + the audio's
    duration, since a loaded server may still be catching up) and then gives up with
    `result.timed_out`. Raises OSError / websockets errors when it cannot connect."""
    result = StreamResult()
    stop = stop or asyncio.Event()
    # a hop's samples, in frames the server accepts (a hop of more than ~32 s is several)
    frame_samples = min(max(1, int(hop_s * SAMPLE_RATE)), MAX_FRAME_BYTES // PCM_S16LE_BYTES)
    async with websockets.connect(url, max_size=None, close_timeout=5) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "start",
                    "sample_rate": SAMPLE_RATE,
                    "channels": 1,
                    "encoding": "pcm_s16le",
                    **(start or {}),
                }
            )
        )
        t0 = time.monotonic()

        async def receive() -> None:
            async for message in ws:
                event = json.loads(message)
                result.events.append(event)
                result.arrival_s.append(time.monotonic() - t0)
                if on_event is not None:
                    on_event(event)

        receiver = asyncio.create_task(receive())
        try:
            await _send_audio(ws, frames(chunks, frame_samples), result, receiver, speed, stop)
            if receiver.done():
                pass  # the server closed (error, drain) before all audio was sent
            elif result.sent_s > 0:
                await ws.send(json.dumps({"type": "end"}))
            else:  # stopped before any audio: `end` would be a protocol error, and no final
                await ws.close()
            if final_timeout_s is None:
                final_timeout_s = CLOSE_TIMEOUT_S + result.sent_s
            await asyncio.wait_for(asyncio.shield(receiver), final_timeout_s)
        except websockets.ConnectionClosed:
            pass
        except TimeoutError:
            # TimeoutError is an OSError: caught here so that it never reads as "cannot connect".
            result.timed_out = True
        finally:
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
        result.close_code = ws.close_code
    return result


async def _send_audio(
    ws: websockets.ClientConnection,
    frames: Iterator[Samples],
    result: StreamResult,
    receiver: asyncio.Task[None],
    speed: float,
    stop: asyncio.Event,
) -> None:
    """Send `frames` paced at `speed` x real time from now, until they run out, the server
    closes (`receiver` is done), `stop` is set or the audio fails (`result.audio_error`)."""
    t0 = time.monotonic()
    num_samples_sent = 0
    while True:
        try:
            frame = next(frames, None)
        except LivemeetError as exc:
            result.audio_error = exc
            frame = None
        if frame is None or receiver.done() or stop.is_set():
            result.stopped_early = frame is not None or result.audio_error is not None
            result.interrupted = stop.is_set()
            return
        # PCM16 frame by frame: the whole file at once took ~385 MB more an hour of audio
        await ws.send(to_pcm16(frame))
        num_samples_sent += frame.size
        result.sent_s = num_samples_sent / SAMPLE_RATE
        delay_s = t0 + result.sent_s / speed - time.monotonic()
        with contextlib.suppress(TimeoutError):  # the pacing wait, cut short by `stop`
            await asyncio.wait_for(stop.wait(), max(0.0, delay_s))


def format_event(event: dict[str, Any]) -> str:
    """One human-readable line per event."""
    kind = event.get("type")

    def seg(s: dict[str, Any]) -> str:
        return f"[{s['start']:7.2f}-{s['end']:7.2f}] {s['speaker']}: {s['text']}"

    if kind == "segment.partial":
        tail = " | ".join(seg(s) for s in event["segments"]) or "(empty)"
        return f"~ rev {event['rev']}: {tail}"
    if kind == "segment.final":
        return f"= {seg(event)}"
    if kind == "transcript.final":
        return (
            f"# transcript.final: {len(event['segments'])} segments, "
            f"{event['duration']:.2f} s, coverage {event['coverage']:.2f}, "
            f"{event['finish_reason']}"
        )
    if kind == "session.ready":
        demo = " (DEMO backend)" if event.get("demo") else ""
        return f"# session {event['session_id']} ready, model {event['model']}{demo}"
    if kind == "error":
        return f"! error {event['code']}: {event['message']}"
    return json.dumps(event, ensure_ascii=False)


def run(args: argparse.Namespace) -> int:
    from livemeet.audio.decode import iter_decode

    speed = args.speed if args.speed is not None else (FAST_SPEED if args.fast else 1.0)
    # `not x > 0` also refuses nan, which no comparison is true of
    if not speed > 0 or not 0 < args.hop_s < math.inf:
        print("error: --speed and --hop-s must be positive numbers", file=sys.stderr)
        return 2
    try:
        # here, not by the server: a bad argument exits 2 (README), before the file is decoded
        check_request_text(args.language, args.prompt, args.hotwords)
        url = live_url(args.url)
        # no limit: a live session has none (an upload's MAX_AUDIO_S refused 95-minute files)
        chunks = iter_decode(args.file, max_audio_s=math.inf)
        # the first block before connecting: a file that does not decode at all exits 2
        first = next(chunks)
    except LivemeetError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return 2

    def show(event: dict[str, Any]) -> None:
        line = json.dumps(event, ensure_ascii=False) if args.json else format_event(event)
        print(line, flush=True)

    start: dict[str, Any] = {
        k: v
        for k, v in (
            ("language", args.language),
            ("prompt", args.prompt),
            ("hotwords", args.hotwords),
        )
        if v
    }
    try:
        with contextlib.closing(chunks):  # the file, when sending stops before its end
            result = asyncio.run(
                stream_interruptibly(
                    url,
                    itertools.chain([first], chunks),
                    hop_s=args.hop_s,
                    speed=speed,
                    start=start,
                    on_event=show,
                )
            )
    except BrokenPipeError:
        raise  # stdout's reader went away (`| head`), no connection problem: livemeet.__main__
    except websockets.InvalidStatus as exc:  # an HTTP answer, not a WebSocket: a wrong path?
        print(f"error: cannot connect to {url}: {exc} ({wrong_path_hint(url)})", file=sys.stderr)
        return 2
    except (OSError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
        print(f"error: cannot connect to {url}: {exc}", file=sys.stderr)
        return 2
    if result is None:
        print("interrupted: quit without the final transcript", file=sys.stderr)
        return INTERRUPTED_STATUS
    return report(result, args.file)


def report(result: StreamResult, path: Path) -> int:
    """Say on stderr how the stream ended, when not with a final covering the whole file;
    the exit status."""
    failed = 1
    if result.interrupted:
        failed = INTERRUPTED_STATUS
    if result.timed_out:
        print("error: no transcript.final from the server in time after 'end'", file=sys.stderr)
        return failed
    if result.final is None:
        print(f"no transcript.final (close code {result.close_code})", file=sys.stderr)
        return failed
    if result.audio_error is not None:
        # a file damaged mid-way: what decoded before the damage was sent and transcribed
        exc = result.audio_error
        print(
            f"error: {exc.code}: {exc.message} (after {result.sent_s:.2f} s of audio; the "
            f"transcript covers {float(result.final['duration']):.2f} s)",
            file=sys.stderr,
        )
        return failed
    if (why := result.shortfall(file_seconds(result, path))) is not None:
        # a transcript of part of the file: the work ran and fell short (README, exit codes)
        print(f"error: {why}", file=sys.stderr)
        return failed
    return 0


def file_seconds(result: StreamResult, path: Path) -> float:
    """The file's length in seconds: all was sent, or (sending stopped early) what its header
    declares, at least what was sent (an MP3's is an estimate)."""
    if not result.stopped_early:
        return result.sent_s
    from livemeet.audio.decode import probe

    try:
        return max(probe(path).duration_s, result.sent_s)
    except LivemeetError:  # it probed a moment ago; gone since: say what is known
        return result.sent_s


async def stream_interruptibly(
    url: str, chunks: Iterable[Samples], **kwargs: Any
) -> StreamResult | None:
    """`stream_audio`, where a first Ctrl-C (SIGINT) stops the audio, sends `end` and still
    waits for the final transcript (the server drops the session of a client that just
    leaves: an hour streamed, and its transcript, would be lost), and a second gives up at
    once: None. Where the loop cannot take signals (Windows), Ctrl-C quits at once."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    task = asyncio.ensure_future(stream_audio(url, chunks, stop=stop, **kwargs))

    def on_interrupt() -> None:
        if stop.is_set():
            task.cancel()
            return
        stop.set()
        print(
            "stopping: no more audio is sent; waiting for the final transcript "
            "(Ctrl-C again to quit without it)",
            file=sys.stderr,
            flush=True,
        )

    handled = True
    try:
        loop.add_signal_handler(signal.SIGINT, on_interrupt)
    except (NotImplementedError, RuntimeError):  # Windows; a loop outside the main thread
        handled = False
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # we were cancelled, not only the stream by a second Ctrl-C
        return None
    finally:
        if handled:
            loop.remove_signal_handler(signal.SIGINT)
