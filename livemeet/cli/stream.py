"""`livemeet stream FILE [--url ws://HOST:PORT/v1/live]`: stream a file to a running server as a
live session (by default this machine's `livemeet serve`, ws://127.0.0.1:8000/v1/live).

Audio goes out in hop-sized PCM16 frames paced in audio time: real time by default, `--fast`
(or `--speed X`) divides every wait, so the server still sees a growing stream and sends
partials. Events are printed as they arrive.

A live session has no length limit, so neither has `stream`. The file is decoded whole before
the first frame goes out (4 bytes a sample: ~230 MB an hour of audio, ~700 MB for 3 hours; a
file not mono 16 kHz briefly holds twice that while its decoded blocks are joined); frames are
converted to PCM16 as they are sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import websockets

from livemeet.audio.constants import LIVE_HOP_S, MAX_FRAME_BYTES, PCM_S16LE_BYTES, SAMPLE_RATE
from livemeet.cli.request_text import add_request_text_flags, check_request_text
from livemeet.errors import LivemeetError
from livemeet.gateway.live_protocol import LIVE_PATH
from livemeet.transcriber import Samples

FAST_SPEED = 4.0  # x real time for --fast
DEFAULT_URL = f"ws://127.0.0.1:8000{LIVE_PATH}"  # `livemeet serve` on its defaults
CLOSE_TIMEOUT_S = 30.0  # s to wait for transcript.final after `end`, plus the audio's duration


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "stream", help="stream an audio file to a live session", description=__doc__
    )
    p.add_argument("file", type=Path, help="audio file (any format FFmpeg reads), of any length")
    p.add_argument(
        "--url",
        default=DEFAULT_URL,
        help=f"the server's live endpoint; a URL without a path gets {LIVE_PATH} "
        "(default %(default)s)",
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
    sent_s: float = 0.0  # s of audio sent: less than the file's when the server ended early

    @property
    def final(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e["type"] == "transcript.final"), None)

    @property
    def error(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e["type"] == "error"), None)

    def shortfall(self, file_s: float) -> str | None:
        """Why the final transcript does not cover all `file_s` seconds of the file, or None:
        a server that shuts down drains the session (ends it early, closes 1001; protocol.md);
        its final covers only the audio it had received then, and the rest was never sent."""
        final = self.final
        # the wire's durations are rounded to the ms (protocol.md): 30.0000625 s arrive as 30.0
        if final is None or final["duration"] >= round(file_s, 3):
            return None
        covered_s = float(final["duration"])
        # the final's duration is what the server read (protocol.md): frames sent past it may
        # have sat unread in socket buffers, so it, not `sent_s`, is where to resend from
        return (
            f"the server ended the session early (close {self.close_code}): the transcript "
            f"covers {covered_s:.2f} s of the {file_s:.2f} s file; resend from {covered_s:.2f} s "
            f"(the last {file_s - covered_s:.2f} s are not transcribed; {self.sent_s:.2f} s "
            "had been sent)"
        )


def live_url(url: str) -> str:
    """`url`, with the live endpoint's path when it has none (`ws://host:8000` or `.../`):
    the server answers its root with the web page, which the WebSocket client reported only
    as "server rejected WebSocket connection: HTTP 200" (a user trial)."""
    parts = urllib.parse.urlsplit(url)
    if parts.path in ("", "/"):
        return urllib.parse.urlunsplit(parts._replace(path=LIVE_PATH))
    return url


def to_pcm16(samples: Samples) -> bytes:
    """float32 [-1, 1] -> PCM16 LE bytes."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


async def stream_samples(
    url: str,
    samples: Samples,
    *,
    hop_s: float = LIVE_HOP_S,
    speed: float = 1.0,
    start: dict[str, Any] | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    final_timeout_s: float | None = None,
) -> StreamResult:
    """Stream 16 kHz mono float32 `samples` to `url`, paced at `speed` x real time in frames
    of `hop_s` seconds; then `end`, and collect events until the server closes.

    After `end` it waits `final_timeout_s` (default: CLOSE_TIMEOUT_S + the audio's duration,
    since a loaded server may still be catching up) and then gives up with
    `result.timed_out`. Raises OSError / websockets errors when it cannot connect."""
    if final_timeout_s is None:
        final_timeout_s = CLOSE_TIMEOUT_S + len(samples) / SAMPLE_RATE
    result = StreamResult()
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
            for offset in range(0, len(samples), frame_samples):
                if receiver.done():
                    break  # the server closed (error) before all audio was sent
                # PCM16 frame by frame: the whole file at once took ~385 MB more an hour of audio
                frame = samples[offset : offset + frame_samples]
                await ws.send(to_pcm16(frame))
                result.sent_s = (offset + len(frame)) / SAMPLE_RATE
                await asyncio.sleep(max(0.0, t0 + result.sent_s / speed - time.monotonic()))
            if not receiver.done():
                await ws.send(json.dumps({"type": "end"}))
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
    from livemeet.audio.decode import decode_file

    speed = args.speed if args.speed is not None else (FAST_SPEED if args.fast else 1.0)
    if speed <= 0 or args.hop_s <= 0:
        print("error: --speed and --hop-s must be positive", file=sys.stderr)
        return 2
    try:
        # here, not by the server: a bad argument exits 2 (README), before the file is decoded
        check_request_text(args.language, args.prompt, args.hotwords)
        # no limit: a live session has none (an upload's MAX_AUDIO_S refused 95-minute files)
        samples = decode_file(args.file, max_audio_s=math.inf)
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
    url = live_url(args.url)
    try:
        result = asyncio.run(
            stream_samples(url, samples, hop_s=args.hop_s, speed=speed, start=start, on_event=show)
        )
    except BrokenPipeError:
        raise  # stdout's reader went away (`| head`), no connection problem: livemeet.__main__
    except websockets.InvalidStatus as exc:  # an HTTP answer, not a WebSocket: a wrong path?
        print(
            f"error: cannot connect to {url}: {exc} (is it a livemeet server's {LIVE_PATH}?)",
            file=sys.stderr,
        )
        return 2
    except (OSError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
        print(f"error: cannot connect to {url}: {exc}", file=sys.stderr)
        return 2
    if result.timed_out:
        print("error: no transcript.final from the server in time after 'end'", file=sys.stderr)
        return 1
    if result.final is None:
        print(f"no transcript.final (close code {result.close_code})", file=sys.stderr)
        return 1
    if (why := result.shortfall(len(samples) / SAMPLE_RATE)) is not None:
        # a transcript of part of the file: the work ran and fell short (README, exit codes)
        print(f"error: {why}", file=sys.stderr)
        return 1
    return 0
