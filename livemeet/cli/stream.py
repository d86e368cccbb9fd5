"""`livemeet stream FILE [--url ws://HOST:PORT/v1/live]`: stream a file to a running server as a
live session (by default this machine's `livemeet serve`, ws://127.0.0.1:8000/v1/live).

FILE `-` reads the audio from standard input as it comes (a FIFO or /dev/stdin too), e.g. a
recording as it is made: `arecord -f S16_LE -r 16000 | livemeet stream -`, or
`ffmpeg -i talk.mp4 -f wav - | livemeet stream - --fast`. It is decoded by FFmpeg without
seeking, so a WAV, FLAC, MP3, Ogg, WebM or WavPack stream; not an MP4 whose index is at its
end, a CAF of compressed audio or a WavPack of more than 2 channels (save those to a file).
Its first audio comes once FFmpeg has read enough to know the format (~100 KB of a WAV: 3.3 s
of 16-kHz mono recorded as it goes, sent at once then); it ends at the end of the input (or
Ctrl-C). A file stopped early
(Ctrl-C, a server that ended the session) says from where to resend it, and `--from-s` sends
it from there (to a new session, whose times count from that point); a stream cannot be
resent, so it only says how much was transcribed.

Audio goes out in hop-sized PCM16 frames paced in audio time: real time by default, `--fast`
(or `--speed X`) divides every wait, so the server still sees a growing stream and sends
partials. Events are printed as they arrive (not `audio.ack`: the server's receipts, used to
know which audio a resume may need). When the session starts, stderr gets its read-only
captions overlay URL (for OBS) and transcript URL (docs/protocol.md, "Captions").

A live session has no length limit, so neither has `stream`: the file is decoded as it is
sent, a block at a time, so its memory stays a few MB whatever the file's length (a whole
decode would hold ~230 MB an hour of audio), plus the audio the server has not acknowledged yet,
kept for a resume (at most MAX_UNACKED_S: sending waits for an ack past it).

A connection lost without a close frame (a network blip: 1006, a reset) does not lose the
session: `stream` reconnects (0.25 s, doubling to 5 s) for as long as the server keeps the
session (`resume_window_s` of its `session.ready`), resumes it, sends the audio on from the
offset the server reports, and prints each final once though the resume replays them
(docs/protocol.md, "Resume"). A server it cannot reach at all may be restarting after a crash,
and a restarted server keeps its sessions for a window from its own start: each failed
attempt moves the deadline to a window past it, up to RECONNECT_OUTAGE_MAX_S after the drop
(`resume_deadline`). A server that restarts (SIGTERM with `serve --shutdown-live keep`: a
`server_restarting` error, close 1012) keeps the session for its next start: that close is
resumed as a drop to a server that cannot be reached, for up to RECONNECT_OUTAGE_MAX_S. A
refused resume (not_found, unauthorized, session_taken_over: every other close the server
sends) ends it.

Ctrl-C stops sending, sends `end` and still waits for the final transcript of what was sent
(the server drops the session of a client that just leaves, and its transcript with it); a
second Ctrl-C quits at once. Exit status: 0 for a final covering the whole file, 1 for no final
or one that covers part of it (it says from which second to resend), 2 when it could not run
(no server to connect to, or one that refused to start the session: not ready, at capacity,
an API key refused), 130 after Ctrl-C. A session lost to the network (no resume: the server
has resume off, refused it, or the window passed) exits 1. A server whose disk fails ends the
session itself: its final (printed as any) comes before a `storage_failed` error and a 4507
close, which stderr repeats (the server may not have stored that final); the exit status is
then the final's coverage. With `--no-wait-revision` and a revision promised, that error
comes only after the revision, which `stream` does not wait for: it closes at the final and
never sees it (the final's `duration` still says what it covers; the transcript URL says
whether the server stored it).

A server that asks for an API key (docs/protocol.md, "API keys") gets `--api-key` (or
LIVEMEET_API_KEY) as `Authorization: Bearer` on every upgrade request, resumes included.

TLS (a wss:// or https:// --url, `serve --tls-cert/--tls-key`): the server's certificate is
checked against the system's trust store, or the PEM bundle OpenSSL's SSL_CERT_FILE names
where it is set. `--cacert FILE` trusts the certificates in FILE and nothing else: a server
with a self-signed certificate is reached with `--cacert` that certificate (its cert.pem).

Revision (docs/protocol.md, "Revision"): where `session.ready` says `revise`, the server sends
`transcript.revised` after `transcript.final` (the whole meeting re-decoded offline), and
`stream` waits for it: it is printed where the final's segments are, after them, as the
transcript that replaces them (a `# transcript.revised` line, then one `r` line a segment; in
--json, the event), so the last segment lines on stdout are the transcript to keep. A
connection lost between the two is resumed for it. `--no-wait-revision` closes after the
final instead: the server still revises and stores it, served by the transcript URL. A
revision that fails or does not come leaves the final, and its exit status, standing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import signal
import ssl
import sys
import threading
import urllib.parse
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import websockets

from livemeet.audio.constants import (
    LIVE_HOP_S,
    LIVE_MAX_FRAME_S,
    LIVE_MIN_FRAME_S,
    MAX_FRAME_BYTES,
    SAMPLE_RATE,
)
from livemeet.cli.live_client import StreamResult, resumable_close, stream_audio
from livemeet.cli.request_text import add_request_text_flags, check_request_text
from livemeet.errors import BadAudio, ConfigError, InvalidRequest, LivemeetError
from livemeet.gateway.live_protocol import LIVE_PATH
from livemeet.transcriber import Samples

# the command: its flags, what it prints and its exit status (the docstring above is its --help);
# the WebSocket client it runs (pacing, acks, resume) is livemeet/cli/live_client.py

FAST_SPEED = 4.0  # x real time for --fast
DEFAULT_URL = f"ws://127.0.0.1:8000{LIVE_PATH}"  # `livemeet serve` on its defaults
INTERRUPTED_STATUS = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
API_KEY_ENV = "LIVEMEET_API_KEY"  # --api-key's default
# --url schemes: a ws/wss URL is the endpoint; an http/https one the server (its page's address)
_WS_SCHEMES = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "stream", help="stream an audio file to a live session", description=__doc__
    )
    p.add_argument(
        "file",
        type=Path,
        help="audio file (any format FFmpeg reads), of any length; - reads standard input as it "
        "comes (WAV, FLAC, MP3, Ogg, WebM, WavPack: a stream FFmpeg reads without seeking)",
    )
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
        "--from-s",
        type=start_seconds,
        default=0.0,
        metavar="SECONDS",
        help="send the audio from this many seconds into it (the rest of a file a stopped "
        "stream says to resend from); the transcript's times count from there (default 0)",
    )
    p.add_argument(
        "--hop-s",
        type=hop_seconds,
        default=LIVE_HOP_S,
        help=f"seconds of audio per frame sent, {LIVE_MIN_FRAME_S:g} to {LIVE_MAX_FRAME_S:g} (the "
        "protocol's shortest frame and its largest, 1 MiB) (default %(default)g)",
    )
    add_request_text_flags(p, language_help="sent in `start`; MOSS-TD does not use it")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the server's events as raw JSON, one a line, as the readable lines are "
        "(not audio.ack; a final replayed by a resume once) (default: one readable line each)",
    )
    p.add_argument(
        "--no-wait-revision",
        dest="wait_revision",
        action="store_false",
        help="close after transcript.final, without waiting for transcript.revised (the "
        "server still revises the transcript; its transcript URL serves the revision once it "
        "came) (default: wait, and print the revised transcript after the final)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help=f"the server's API key (`livemeet keys create`), sent as 'Authorization: Bearer' "
        f"(default: ${API_KEY_ENV}, else none; a key on the command line is visible to other "
        "users of this machine, the variable is not)",
    )
    p.add_argument(
        "--cacert",
        type=Path,
        default=None,
        metavar="FILE",
        help="for a wss:// or https:// --url: trust the certificates in this PEM file, and no "
        "other (a server with a self-signed --tls-cert: pass that cert.pem) (default: the "
        "system's trust store, or the PEM bundle $SSL_CERT_FILE names)",
    )
    p.set_defaults(func=run)


STDIN = Path("-")  # the audio argument that reads standard input


def is_stream(path: Path) -> bool:
    """Whether an audio argument is read as a stream: `-`, or a pipe, FIFO or device."""
    return path == STDIN or (path.exists() and not path.is_file() and not path.is_dir())


def check_not_a_directory(path: Path) -> None:
    """Raise BadAudio, saying so plainly, when the audio argument `path` is a directory
    (`stream` said "not an audio file ... FFmpeg: Is a directory": a trial). The message does
    not name it: `stream` and `transcribe` put the path in front of a file's error."""
    if path.is_dir():
        raise BadAudio("a directory, not an audio file")


def open_stream(path: Path) -> BinaryIO:
    """A stream argument (`is_stream`) opened for `iter_decode_stream`: unbuffered, so a read
    returns what the writer has written, not a whole buffer's worth (32 KB: a second of 16-kHz
    audio recorded live); standard input is left open when it closes. Raises BadAudio for `-`
    at a terminal (nothing was piped in) or a path that cannot be opened."""
    if path == STDIN and sys.stdin.isatty():
        raise BadAudio(
            "- reads audio from standard input, which is a terminal: pipe the audio in "
            "(e.g. arecord -f S16_LE -r 16000 | livemeet stream -)"
        )
    try:
        if path == STDIN:
            return open(sys.stdin.fileno(), "rb", buffering=0, closefd=False)
        return open(path, "rb", buffering=0)
    except OSError as exc:
        raise BadAudio(f"cannot read it: {exc.strerror}") from exc


def first_chunk(chunks: Iterator[Samples], piped: bool) -> Samples:
    """`next(chunks)`, raising what it raises. A pipe's first block is read on a daemon
    thread and awaited here, so that Ctrl-C interrupts the wait: read on this thread, the
    interrupt was lost (PyAV's callback that reads the pipe drops a KeyboardInterrupt,
    "Exception ignored", and FFmpeg reads on), and Ctrl-C did nothing until the writer had
    written enough or closed. A daemon: the exit does not wait for a read a quiet writer
    holds."""
    if not piped:
        return next(chunks)
    outcome: list[Samples | BaseException] = []
    read = threading.Event()

    def read_first() -> None:
        try:
            outcome.append(next(chunks))
        except BaseException as exc:  # raised below, on this thread's caller
            outcome.append(exc)
        finally:
            read.set()

    threading.Thread(target=read_first, name="livemeet-pipe-first", daemon=True).start()
    read.wait()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def start_seconds(text: str) -> float:
    """--from-s: a finite number of seconds >= 0. Raises argparse.ArgumentTypeError (exit 2,
    with the usage) for anything else, nan included."""
    try:
        from_s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.0 <= from_s < math.inf:  # also refuses nan, which no comparison is true of
        raise argparse.ArgumentTypeError(f"{text}: seconds must be finite and >= 0")
    return from_s


def skip_start(
    chunks: Generator[Samples, None, None], from_s: float
) -> Generator[Samples, None, None]:
    """`chunks` (16-kHz float32 blocks) without their first `from_s` seconds (rounded to a
    sample); closing this closes `chunks` (the file). Raises BadAudio, as the first block is
    asked for, where the audio ends at or before `from_s` (nothing would be sent)."""
    left = round(from_s * SAMPLE_RATE)  # samples still to skip
    with contextlib.closing(chunks):
        for chunk in chunks:
            rest = chunk[left:] if left > 0 else chunk
            left = max(0, left - chunk.size)
            if rest.size:
                yield rest
                break
        else:
            skipped_s = (round(from_s * SAMPLE_RATE) - left) / SAMPLE_RATE
            raise BadAudio(
                f"the audio ends at {skipped_s:.2f} s: nothing after --from-s {from_s:g}"
            )
        yield from chunks


def hop_seconds(text: str) -> float:
    """--hop-s: a number of seconds from LIVE_MIN_FRAME_S (docs/protocol.md's shortest frame;
    0.0001 sent one-sample frames, each read as 10 ms by the server's pacing: a trial) to
    LIVE_MAX_FRAME_S (its largest frame, 1 MiB of 16-kHz PCM16). Raises
    argparse.ArgumentTypeError (exit 2, with the usage) for anything else, nan included."""
    try:
        hop_s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    # `not a <= x <= b` also refuses nan, which no comparison is true of
    if not LIVE_MIN_FRAME_S <= hop_s <= LIVE_MAX_FRAME_S:
        raise argparse.ArgumentTypeError(
            f"{text} s is outside {LIVE_MIN_FRAME_S:g}..{LIVE_MAX_FRAME_S:g} s: the live "
            f"protocol's frames hold at least {LIVE_MIN_FRAME_S * 1000:g} ms of audio and at most "
            f"{MAX_FRAME_BYTES} bytes"
        )
    return hop_s


def live_url(url: str) -> str:
    """The live endpoint `url` names (see --url's help). A ws/wss URL is taken as given, so a
    proxy may serve the endpoint at any path, `/` included; only a bare `ws://host:8000` gets
    LIVE_PATH (a WebSocket URL needs a path; the server's root is its web page, which the client
    reported only as "server rejected WebSocket connection: HTTP 200": a user trial). An
    http/https URL is the address of the server's page, as a browser shows it, never an endpoint.
    Raises InvalidRequest for another scheme, no host, a malformed host or port, or a
    fragment."""
    try:  # an unclosed IPv6 bracket, or a port not a number in 0-65535: ValueError
        parts = urllib.parse.urlsplit(url)
        _ = parts.port
    except ValueError as exc:
        raise InvalidRequest(f"--url {url!r} is not a valid URL: {exc}", param="url") from exc
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


def client_ssl_context(cacert: Path | None, url: str) -> ssl.SSLContext | None:
    """The TLS context to reach the live endpoint `url` (ws/wss, `live_url`) with: None, the
    websockets default (the system's trust store, or OpenSSL's $SSL_CERT_FILE), without
    `cacert`; else one trusting only the certificates in the PEM file `cacert`, so that a
    self-signed server is reached without trusting it for every program on the machine.
    Raises ConfigError for a file that holds no certificate or cannot be read, and for a
    `url` without TLS (where `cacert` would be ignored)."""
    if cacert is None:
        return None
    if urllib.parse.urlsplit(url).scheme != "wss":
        raise ConfigError(f"--cacert is for a wss:// or https:// --url, not {url}", param="cacert")
    try:
        return ssl.create_default_context(cafile=cacert)
    except (OSError, ssl.SSLError) as exc:  # missing, unreadable, not PEM certificates
        raise ConfigError(f"cannot load --cacert {cacert}: {exc.strerror or exc}") from exc


def wrong_path_hint(url: str) -> str:
    """What to tell a user whose `url` got an HTTP answer instead of a WebSocket: most likely
    the server's page at `ws://host:8000/`, which --url takes as given."""
    parts = urllib.parse.urlsplit(url)
    if parts.path.endswith(LIVE_PATH):
        return f"is it a livemeet server's {LIVE_PATH}?"
    # the live endpoint sits beside the API's other paths (/v1/models, /v1/live/), not under
    # them: what comes before their /v1 is the server's root (or a proxy's prefix)
    segments = parts.path.rstrip("/").split("/")
    root = "/".join(segments[: segments.index("v1")]) if "v1" in segments else "/".join(segments)
    suggested = urllib.parse.urlunsplit(parts._replace(path=root + LIVE_PATH))
    return f"a ws:// URL is used as given: did you mean {suggested}?"


def captions_links(url: str, ready: dict[str, Any]) -> str | None:
    """For a new session's `session.ready`: the session's captions overlay and transcript
    URLs, one line each, on the server `url` (the live endpoint) belongs to, read-only with its
    `captions_token` (docs/protocol.md, "Captions"). Only `session.ready` carries that token,
    and `stream`'s readable lines leave it out, so a user who wanted the overlay in OBS, or
    the transcript after a lost connection, had to rerun with --json (a trial). None for a
    resume, a server without captions, or an endpoint not at LIVE_PATH (a proxy's own path:
    where the page is is unknown)."""
    session_id, token = ready.get("session_id"), ready.get("captions_token")
    parts = urllib.parse.urlsplit(url)
    if ready.get("resumed") or not session_id or not token or not parts.path.endswith(LIVE_PATH):
        return None
    scheme = "https" if parts.scheme == "wss" else "http"
    base = urllib.parse.urlunsplit(
        (scheme, parts.netloc, parts.path[: -len(LIVE_PATH)] + "/", "", "")
    )
    session, query = urllib.parse.quote(session_id, safe=""), urllib.parse.quote(token, safe="")
    # a line each, the URL last: a terminal's link (or a double-click) took "...&token=X;"
    # from one line holding both, the ';' spoiling the token (4401 in OBS: a new user's trial)
    return (
        f"captions overlay (read-only): {base}captions.html?session={session}&token={query}\n"
        f"transcript (read-only): {base}v1/sessions/{session}/transcript?token={query}"
    )


def counted(n: int, noun: str) -> str:
    """`n` and `noun`, plural but for one ("1 segments" read as a slip: a new user's trial)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def format_event(event: dict[str, Any]) -> str:
    """One human-readable line per event; for `transcript.revised`, one more per segment."""
    kind = event.get("type")

    def seg(s: dict[str, Any]) -> str:
        return f"[{s['start']:7.2f}-{s['end']:7.2f}] {s['speaker']}: {s['text']}"

    if kind == "segment.partial":
        tail = " | ".join(seg(s) for s in event["segments"]) or "(empty)"
        return f"~ rev {event['rev']}: {tail}"
    if kind == "segment.final":
        return f"= {seg(event)}"
    if kind == "transcript.final":
        # coverage (protocol.md): the share of the audio before the last segment's end; the
        # bare "coverage 0.96" left a new user guessing (a trial)
        return (
            f"# transcript.final: {counted(len(event['segments']), 'segment')}, "
            f"{event['duration']:.2f} s, segments to {event['coverage']:.0%} of it, "
            f"{event['finish_reason']}"
        )
    if kind == "transcript.revised":
        # the transcript that replaces the finals shown: its segments, as the finals were
        lines = [
            f"# transcript.revised: {counted(len(event['segments']), 'segment')}, superseding "
            f"{counted(len(event['supersedes']), 'final')}, {event['finish_reason']}",
            *(f"r {seg(s)}" for s in event["segments"]),
        ]
        return "\n".join(lines)
    if kind == "session.ready":
        demo = " (DEMO backend)" if event.get("demo") else ""
        if event.get("resumed"):
            at_s = int(event["offset"]) / SAMPLE_RATE
            return f"# session {event['session_id']} resumed at {at_s:.2f} s{demo}"
        window_s = event.get("resume_window_s") or 0
        resume = f"resumable for {window_s:g} s" if event.get("resume_token") else "no resume"
        return f"# session {event['session_id']} ready, model {event['model']}{demo}, {resume}"
    if kind == "error":
        return f"! error {event['code']}: {event['message']}"
    if kind == "speaker.renamed":  # from another client of the session (the recorder page)
        name = event.get("name")
        named = f"named {json.dumps(name, ensure_ascii=False)}" if name else "name removed"
        return f"# speaker {event['speaker']} {named}"
    if kind == "speaker.merged":
        return f"# speaker {event['speaker']} merged into {event['into']} (shown as it from now on)"
    return json.dumps(event, ensure_ascii=False)


def run(args: argparse.Namespace) -> int:
    """`livemeet stream`: send a file (or standard input) to a server's live endpoint and print
    its events (stdout; notes on stderr). Returns the exit status: 2 for a bad argument, audio
    that does not decode or a connection that cannot be made, INTERRUPTED_STATUS (130) for
    Ctrl-C, else `report`'s."""
    from livemeet.audio.decode import iter_decode, iter_decode_stream

    speed = args.speed if args.speed is not None else (FAST_SPEED if args.fast else 1.0)
    # `not x > 0` also refuses nan, which no comparison is true of (--hop-s: `hop_seconds`)
    if not speed > 0:
        print("error: --speed must be a positive number", file=sys.stderr)
        return 2
    try:
        # here, not by the server: a bad argument exits 2 (README), before the file is decoded
        check_request_text(args.language, args.prompt, args.hotwords)
        url = live_url(args.url)
        context = client_ssl_context(args.cacert, url)
    except LivemeetError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return 2
    # the file's errors name it, as transcribe's do: `stream missing.wav` said only "cannot
    # read the audio file: No such file or directory" (a new user's trial)
    named = "" if args.file == STDIN else f"{args.file}: "
    try:
        # no limit: a live session has none (an upload's MAX_AUDIO_S refused 95-minute files)
        check_not_a_directory(args.file)
        piped = is_stream(args.file)
        if piped:
            chunks = iter_decode_stream(open_stream(args.file), max_audio_s=math.inf)
        else:
            chunks = iter_decode(args.file, max_audio_s=math.inf)
        if args.from_s:
            chunks = skip_start(chunks, args.from_s)
        # the first block before connecting: a file that does not decode at all exits 2
        first = first_chunk(chunks, piped)
    except LivemeetError as exc:
        print(f"error: {named}{exc.code}: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while a pipe's first audio was awaited: nothing sent
        print("interrupted before any audio was read", file=sys.stderr)
        return INTERRUPTED_STATUS

    def notice(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    # a cut WAV is sent as far as it goes, and its final then covers "the whole file"
    if not piped and (cut := cut_note(args.file)) is not None:
        notice(f"warning: {args.file}: {cut}")
    if args.from_s:
        notice(
            f"sending from {args.from_s:.2f} s into the audio: the transcript's times count "
            f"from there (add {args.from_s:.2f} s for the file's)"
        )

    def show(event: dict[str, Any]) -> None:
        line = json.dumps(event, ensure_ascii=False) if args.json else format_event(event)
        print(line, flush=True)
        if event.get("type") == "session.ready" and (links := captions_links(url, event)):
            notice(links)  # stderr, with the other notes: stdout stays the events

    start: dict[str, Any] = {
        k: v
        for k, v in (
            ("language", args.language),
            ("prompt", args.prompt),
            ("hotwords", args.hotwords),
        )
        if v
    }
    # the file, when sending stops before its end; a pipe's decoder is left to the process's
    # exit: Ctrl-C may leave it reading on its thread (live_client.PipeFrames)
    closing = contextlib.nullcontext() if piped else contextlib.closing(chunks)
    try:
        with closing:
            result = asyncio.run(
                stream_interruptibly(
                    url,
                    itertools.chain([first], chunks),
                    hop_s=args.hop_s,
                    speed=speed,
                    start=start,
                    on_event=show,
                    on_notice=notice,
                    api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
                    wait_revision=args.wait_revision,
                    ssl_context=context,
                    from_pipe=piped,
                )
            )
    except BrokenPipeError:
        raise  # stdout's reader went away (`| head`), no connection problem: livemeet.__main__
    except websockets.InvalidStatus as exc:  # an HTTP answer, not a WebSocket: a wrong path?
        print(f"error: cannot connect to {url}: {exc} ({wrong_path_hint(url)})", file=sys.stderr)
        return 2
    except (OSError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
        hint = ""
        if isinstance(exc, ssl.SSLCertVerificationError):  # e.g. serve's self-signed --tls-cert
            hint = " (a certificate this machine does not trust: --cacert FILE trusts it)"
        elif isinstance(exc, ssl.SSLError) and exc.reason == "WRONG_VERSION_NUMBER":
            # a plain-HTTP server's answer read as TLS: OpenSSL's words name no cause
            hint = " (the server does not speak TLS: one without --tls-cert is ws:// or http://)"
        elif isinstance(exc, websockets.InvalidMessage) and url.startswith("ws://"):
            # the other way round: a TLS server's answer to plain HTTP is no HTTP at all
            hint = " (a server with --tls-cert speaks TLS: its URL is wss:// or https://)"
        elif isinstance(exc, ConnectionRefusedError):  # said only "Connect call failed"
            hint = " (nothing listens there: start `livemeet serve`, or give its address, --url)"
        print(f"error: cannot connect to {url}: {exc}{hint}", file=sys.stderr)
        return 2
    if result is None:
        print("interrupted: quit without the final transcript", file=sys.stderr)
        return INTERRUPTED_STATUS
    return report(result, None if piped else args.file, args.from_s)


def report(result: StreamResult, path: Path | None, from_s: float = 0.0) -> int:
    """Say on stderr how the stream ended, when not with a final covering the whole file
    (`path`; None for a stream, whose whole is what was read) from `from_s` (s; where sending
    began) on; the exit status."""
    failed = 1
    if result.interrupted:
        failed = INTERRUPTED_STATUS
    if result.revision_pending and not result.timed_out:
        print(
            "transcript.final stands for now: the server is still revising it (transcript.revised "
            "will be served by the transcript URL above)",
            file=sys.stderr,
        )
    if result.timed_out and result.final is not None:
        # the final came and its revision (transcript.revised) did not: the final stands
        print("warning: no transcript.revised in time after transcript.final", file=sys.stderr)
    elif result.timed_out:
        print("error: no transcript.final from the server in time after 'end'", file=sys.stderr)
        return failed
    if result.revision_lost is not None:  # after the final: the final and its status stand
        print(
            f"warning: no transcript.revised: {result.revision_lost}; transcript.final stands "
            "(the transcript URL above serves the revision, if the server stored one)",
            file=sys.stderr,
        )
    if result.failure is not None:
        print(f"error: {result.failure}", file=sys.stderr)
        return failed
    if (refusal := result.refusal) is not None and not result.interrupted:
        # the first connection's (a resume refused, for its key too, is a `failure`, above)
        detail = f"close code {result.close_code}"
        if refusal["code"] == "unauthorized":
            detail += f"; --api-key or {API_KEY_ENV}"
        print(
            f"error: the server refused the session: {refusal['code']}: {refusal['message']} "
            f"({detail})",
            file=sys.stderr,
        )
        return 2  # it could not run, as when there is no server to connect to (README)
    if result.final is None:
        # a drop here had no session to resume: the server keeps none, or it was not ready
        dropped = ": the connection dropped" if resumable_close(result.close_code) else ""
        print(f"no transcript.final (close code {result.close_code}{dropped})", file=sys.stderr)
        return failed
    if (closing := result.error_after_final) is not None:
        # the server ended the session itself (its storage failed: the final printed above
        # may be the only copy; an idle client): the final stands, its coverage decides below
        print(
            f"warning: after transcript.final the server closed the session with "
            f"{closing['code']}: {closing['message']} (close {result.close_code})",
            file=sys.stderr,
        )
    if result.audio_error is not None:
        # a file damaged mid-way: what decoded before the damage was sent and transcribed
        exc = result.audio_error
        # in the file's seconds, as the resend hint is: sending began at `from_s`
        sent = f"{result.sent_s:.2f} s of audio" + (f" from {from_s:.2f} s" if from_s else "")
        print(
            f"error: {exc.code}: {exc.message} (after {sent}; the transcript covers "
            f"{float(result.final['duration']):.2f} s)",
            file=sys.stderr,
        )
        return failed
    if path is None:
        if result.stopped_early:  # Ctrl-C, or the server ended it: a pipe cannot be resent
            covered_s = float(result.final["duration"])
            cause = "stopped by Ctrl-C" if result.interrupted else "the server ended the session"
            print(
                f"{cause}: the transcript covers {covered_s:.2f} s of the audio read from "
                f"standard input ({result.sent_s:.2f} s sent)",
                file=sys.stderr,
            )
            return failed
        return 0
    if (why := result.shortfall(file_seconds(result, path, from_s), from_s)) is not None:
        # a transcript of part of the file: the work ran and fell short (README, exit codes)
        print(f"error: {why}", file=sys.stderr)
        return failed
    return 0


def cut_note(path: Path) -> str | None:
    """What a cut WAV lacks (`AudioInfo.cut_note`), from a second read of its header; None for
    a whole file, or one that cannot be probed now (it decoded a moment ago: this is only a
    note, and a file gone since must not stop the stream)."""
    from livemeet.audio.decode import probe

    try:
        return probe(path).cut_note
    except LivemeetError:
        return None


def file_seconds(result: StreamResult, path: Path, from_s: float = 0.0) -> float:
    """The file's length in seconds: all of it from `from_s` was sent, or (sending stopped
    early) what its header declares, at least what was sent (an MP3's is an estimate)."""
    sent_to_s = from_s + result.sent_s
    if not result.stopped_early:
        return sent_to_s
    from livemeet.audio.decode import probe

    try:
        return max(probe(path).duration_s, sent_to_s)
    except LivemeetError:  # it probed a moment ago; gone since: say what is known
        return sent_to_s


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
