"""Live partial latency through the real server, alone or beside long uploads.

Live WebSocket sessions stream audio in real time; uploads run beside them in a closed loop.

DESIGN.md section 10 defines partial latency as the time from the reference end of a word to the
first partial that contains it, measured with `--forced-output` on random weights. The forced
transcript has no word times, so its words are taken as spoken at a uniform rate over their
segment (livemeet.transcript.segments.word_end_times), and a forced live hop writes, after the
segments ending by its audio edge, the words of the one being spoken that end by it, as a model
writes a turn still going on. Per word (`word_latencies`, DESIGN's figure): receive time of the
first message holding a segment with the word's segment's start and at least its words up to
that one, minus the moment the word's end was spoken. Per segment (`segment_latencies`, the
figure sessions 18-23 reported, at the segment's last word): for each segment of the long
workload's transcript (loadtest.workloads.make_forced) that ends inside the streamed audio,
latency = receive time of the first `segment.partial`, `segment.final` or `transcript.final`
holding a segment with its start and end (within TIME_TOL_S) minus the moment its end was
spoken, t0 + end in real time (plus the client's own delay, should it send that frame late). A
segment counts once its end is there, i.e. at its last word; the latency includes the client's
framing (up to FRAME_S), as a recorder's would. Segments first seen only after the client sent
`end` (right after its last frame; the final flush commits them) are counted separately and
included in the latency figures.

With `--head-start-s H` each session streams its first H s HEAD_SPEED times faster than real
time, then the rest in real time, and only segments ending after H count: the late minutes
of a long meeting (DESIGN's 10-minute point) fit one GPU call, with the server holding the
same KV, committed transcript and encoder cache as after H s in real time (its load during
the head is higher, and the first hops after it may still catch up: `latency_by_time`).

Each point starts `sessions` live sessions (session i after i / sessions s) and keeps
`uploads` long uploads in flight beside them (closed loop, started UPLOAD_LEAD_S earlier).
Every session streams `--duration-s` of its own rotation of the meeting (so the encoder's
window cache never hits across sessions) in FRAME_S frames of PCM16, each sent once its audio
has been spoken, then sends `end` and waits for `transcript.final` (at most FINAL_TIMEOUT_S,
and never past the run's --max-seconds less FINAL_BUDGET_MARGIN_S: an overloaded engine still
catching up then leaves a record with the finals missing, not none; the `end`-to-final times
cover only the finals that came, `finals_received` of them). The server runs one forced
transcript for every request (the upload's whole text; a live hop's segments that end by its
audio edge, then the words spoken by it of the one going on).

One JSON line per point (appended to --out, and printed): latency mean, p50, p95, p99 and max
over every session's segments (and p50, p95 by when in the meeting the segment ends:
`latency_by_time`), the same per word (`word_latency_*`, `word_latency_by_time`; after a head
also `steady_word_latency_*`, leaving out the words of its catch-up, CATCH_UP_S), how many
segments were seen before `end`, only after it (the final flush) or never, the client's largest
send lag, how many finals arrived, the time from `end` to `transcript.final` and from connecting
to `session.ready` (median and worst session), the revisions (`revision_fields`: where
`session.ready` promised `transcript.revised`, each session waits for it within the final's
wait, and its delay from `end` is reported as p50, p95 and max, with how many came, failed,
were late or lost with their socket), errors, the uploads completed during the point
with their audio-s/s (over the uploads' own time), the audio seconds the uploads had transcribed
by the point's end, finished or not (they stream: `stream=true`, each segment's end as it
arrives) and that rate, and the increase of the engine's counters over the point (steps by kind,
prefill and decode tokens, host time in steps by part, windows encoded, live hops finished and
their mean time from submission to end, audio commands and their mean wait:
loadtest.http_sweep.engine_fields), and the same increase per LATENCY_BUCKET_S of the sessions'
time (`engine_by_time`, from /metrics scraped every bucket while they stream): whether what
grows with the meeting is the hops' time, their prefill, the forced transcript or the encoder.
On the scripted backend (CPU) uploads finish at once, so their fields say nothing there.

A server with API keys gets $LIVEMEET_API_KEY, where set, as `Authorization: Bearer` on the
uploads and the live upgrades (loadtest.http_sweep.auth_headers).

Usage:
  python -m loadtest.bench_live --sessions 1,16,64 --uploads 0,2 --duration-s 60 \
      --out live.jsonl --max-seconds 420
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import json
import math
import shlex
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import numpy as np

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.engine.gc_pauses import freeze_startup_heap, thaw_heap
from livemeet.gateway.metrics import LIVE_FINAL_PHASES
from livemeet.transcript.parser import parse_transcript
from livemeet.transcript.segments import Segment, word_end_times
from loadtest import workloads as wl
from loadtest.bench_engine import parse_ints, percentile
from loadtest.http_sweep import (
    DEFAULT_SERVE_ARGS,
    ENDPOINT,
    Server,
    auth_headers,
    engine_counters,
    engine_fields,
    parse_phases,
    phase_fields,
    scrape_metrics,
    settled_metrics,
    write_line,
)

LIVE_PATH = "/v1/live"
LIVE_FINAL_HISTOGRAM = "livemeet_live_final_seconds"  # livemeet.gateway.metrics, by phase
FRAME_S = 0.1  # s of audio per binary frame (a browser recorder sends 20-250 ms)
TIME_TOL_S = 0.011  # s; the forced transcript has 2-decimal times, the protocol 3
FINAL_TIMEOUT_S = 120.0  # s to wait for transcript.final after `end`
MIN_FINAL_WAIT_S = 1.0  # s; the least wait for it when the point's budget is nearly spent
# s of a point's budget kept after the finals' wait: metrics settling and the record
FINAL_BUDGET_MARGIN_S = 15.0
READY_TIMEOUT_S = 60.0  # s to wait for session.ready
POINT_MARGIN_S = 30.0  # s a point needs beyond its audio (server drain, the final flush)
UPLOAD_LEAD_S = 5.0  # s the uploads run before the first live session starts (in the engine)
BODIES_PER_UPLOAD = 4  # distinct meetings per closed-loop client: no encoder cache hits
LATENCY_BUCKET_S = 30.0  # s of meeting time per `latency_by_time` bucket (hops re-decode it all)
# s of real time after the head whose words the steady figures leave out: the hops then still
# work off what the head's 4x left queued (100 sessions, docs/benchmarks.md sessions 26-27:
# p95 per word ~3-4 s in that bucket against 1.2-2.5 s in the next ones)
CATCH_UP_S = LATENCY_BUCKET_S
# --head-start-s: the meeting's first seconds are streamed at this many times real time, so a
# call of <= 9 minutes reaches DESIGN's 10-minute point (300 s in 75 s, then 300 s live)
HEAD_SPEED = 4.0
# s between keepalives while a session pauses after its head (--head-pause-s): well inside the
# server's idle timeout (60 s by default), which a paused client would otherwise run out
PAUSE_KEEPALIVE_S = 10.0


@dataclass
class SessionLog:
    """What one live session sent and received; times are time.monotonic() seconds.

    t0: when its first sample was spoken (frame k holds audio [k FRAME_S, (k + 1) FRAME_S)
    and is due at t0 + (k + 1) FRAME_S); sent[k]: when frame k went out; events: (receive
    time, message type, segments as (start s, end s, word count)) for every partial, final
    segment and final transcript; end_sent: when `end` went out (None if it never did)."""

    t0: float = 0.0
    sent: list[float] = field(default_factory=list)
    events: list[tuple[float, str, list[tuple[float, float, int]]]] = field(default_factory=list)
    end_sent: float | None = None
    final_at: float | None = None  # when transcript.final arrived
    # session.ready promised transcript.revised after the final (DESIGN 5.7)
    revise: bool = False
    revised_at: float | None = None  # when transcript.revised arrived
    # how the promised revision ended: "revised", "failed" (revision_failed), "late" (not
    # within the wait), "closed" (the socket closed without it); "" before the final
    revision: str = ""
    ready_s: float | None = None  # s from opening the connection to session.ready
    error: str = ""
    head_frames: int = 0  # the first frames, streamed fast (`live_session`'s head_s)

    def final_after_end_s(self) -> float | None:
        """Seconds from `end` to transcript.final (how long a finished meeting waits for its
        transcript); None when either is missing."""
        if self.end_sent is None or self.final_at is None:
            return None
        return self.final_at - self.end_sent

    def revised_after_end_s(self) -> float | None:
        """Seconds from `end` to transcript.revised (the revision's delay, as the server's
        livemeet_live_revision_seconds); None when either is missing."""
        if self.end_sent is None or self.revised_at is None:
            return None
        return self.revised_at - self.end_sent


@dataclass(frozen=True)
class SegmentLatency:
    """One session's segments against the reference: the latency (s) of every segment seen and
    the end time (s of meeting) of each, how many of them were first seen only after `end`,
    how many never (or whose audio was never sent), and how many were expected."""

    latencies: tuple[float, ...]
    after_end: int
    missed: int
    expected: int
    end_times: tuple[float, ...] = ()


def frame_of(time_s: float) -> int:
    """The index of the frame holding the audio just before `time_s` (s >= 0)."""
    return max(0, math.ceil(round(time_s / FRAME_S, 6)) - 1)


def spoken_at(log: SessionLog, end_s: float) -> float:
    """When audio time `end_s` was spoken: t0 + end_s, later by as much as the frame holding it
    went out past its due time (a client that fell behind is not the server's latency; the
    framing itself, up to FRAME_S, is, as a recorder's would be); inf if never sent."""
    k = frame_of(end_s)
    if k >= len(log.sent):
        return math.inf
    return log.t0 + end_s + max(0.0, log.sent[k] - (log.t0 + (k + 1) * FRAME_S))


def _holds(segments: Sequence[tuple[float, ...]], start_s: float, end_s: float) -> bool:
    return any(
        abs(s[0] - start_s) <= TIME_TOL_S and abs(s[1] - end_s) <= TIME_TOL_S for s in segments
    )


def segment_latencies(
    turns: Sequence[wl.Turn], log: SessionLog, audio_s: float, from_s: float = 0.0
) -> SegmentLatency:
    """Latency of each reference segment ending within the first `audio_s` s and after
    `from_s` (a head start's end: the head is not streamed in real time) (module doc)."""
    shown = (
        (
            turn.end_s,
            next((t for t, _, segs in log.events if _holds(segs, turn.start_s, turn.end_s)), None),
        )
        for turn in turns
        if from_s < turn.end_s <= audio_s + 1e-9
    )
    return tally_latencies(shown, log)


def word_latencies(
    reference: Sequence[Segment], log: SessionLog, audio_s: float, from_s: float = 0.0
) -> SegmentLatency:
    """DESIGN 10's partial latency, per word: for each word of the `reference` segments ending
    within the first `audio_s` s and after `from_s` (`word_end_times`: the synthetic meeting's
    words are spoken at a uniform rate over their segment), the receive time of the first
    message holding a segment with the reference's start and at least the words up to it (a
    partial's open segment holds the words spoken so far), less when the word's end was
    spoken. A segment is known by its start alone: the synthetic turns never overlap
    (loadtest.workloads.plan_turns), so no two start within TIME_TOL_S. Counts as
    `segment_latencies`, per word; one pass over the log (`first_word_times`)."""
    seen = first_word_times(reference, log)
    shown = (
        (end_s, times[i] if i < len(times) else None)
        for ref, times in zip(reference, seen, strict=True)
        for i, end_s in enumerate(word_end_times(ref))
        if from_s < end_s <= audio_s + 1e-9
    )
    return tally_latencies(shown, log)


def tally_latencies(shown: Iterable[tuple[float, float | None]], log: SessionLog) -> SegmentLatency:
    """The `SegmentLatency` of expected items given as (end s in the meeting, receive time of
    the first message holding the item or None): never shown or whose audio was never sent
    count as missed, those first shown after `end` as after_end (their latency kept)."""
    latencies: list[float] = []
    end_times: list[float] = []
    after_end = missed = expected = 0
    for end_s, first in shown:
        expected += 1
        spoken = spoken_at(log, end_s)
        if first is None or math.isinf(spoken):  # never shown, or its audio never sent
            missed += 1
            continue
        if log.end_sent is not None and first >= log.end_sent:
            after_end += 1
        latencies.append(first - spoken)
        end_times.append(end_s)
    return SegmentLatency(tuple(latencies), after_end, missed, expected, tuple(end_times))


def first_word_times(reference: Sequence[Segment], log: SessionLog) -> list[list[float]]:
    """For each reference segment, the receive time of the first message holding its first
    k + 1 words, at index k (as many as were ever shown): one pass over the log's events (in
    receive order), each event segment found among the references by its start (bisection).
    A segment going on from a mid-turn commit (`finalize`, a turn past the 25-s window) starts
    at the cut, so its words count as missed: the benchmark's 3-6 s turns never commit so."""
    order = sorted(range(len(reference)), key=lambda j: reference[j].start_s)
    starts = [reference[j].start_s for j in order]
    counts = [len(reference[j].text.split()) for j in order]
    seen: list[list[float]] = [[] for _ in reference]
    for t, _, segments in log.events:
        for seg in segments:
            k = bisect.bisect_left(starts, seg[0] - TIME_TOL_S)
            if k == len(starts) or starts[k] > seg[0] + TIME_TOL_S:
                continue
            times = seen[order[k]]
            times.extend([t] * (min(seg[2], counts[k]) - len(times)))
    return seen


def latency_summary(name: str, latencies: Sequence[float]) -> dict[str, float | None]:
    """`{name}_mean_s`, `_p50_s`, `_p95_s`, `_p99_s` and `_max_s` of `latencies` (s; all None
    when there are none)."""
    if not latencies:
        return {f"{name}_{k}_s": None for k in ("mean", "p50", "p95", "p99", "max")}
    return {
        f"{name}_mean_s": float(np.mean(latencies)),
        f"{name}_p50_s": percentile(latencies, 50),
        f"{name}_p95_s": percentile(latencies, 95),
        f"{name}_p99_s": percentile(latencies, 99),
        f"{name}_max_s": max(latencies),
    }


def latencies_after(results: Sequence[SegmentLatency], from_s: float) -> list[float]:
    """The latencies (s) of every item that ends at or after `from_s` s of meeting time."""
    return [
        lat
        for r in results
        for lat, end in zip(r.latencies, r.end_times, strict=True)
        if end >= from_s
    ]


def latency_by_time(results: Sequence[SegmentLatency]) -> dict[str, dict[str, float]]:
    """p50 and p95 latency (s) and the count of segments by when in the meeting they end, in
    LATENCY_BUCKET_S buckets keyed "start-end" (s): each hop re-decodes the whole meeting, so
    latency grows with its length."""
    buckets: dict[int, list[float]] = {}
    for r in results:
        for lat, end in zip(r.latencies, r.end_times, strict=True):
            buckets.setdefault(int(end // LATENCY_BUCKET_S), []).append(lat)
    return {
        f"{b * LATENCY_BUCKET_S:.0f}-{(b + 1) * LATENCY_BUCKET_S:.0f}": {
            "p50_s": percentile(v, 50),
            "p95_s": percentile(v, 95),
            "count": len(v),
        }
        for b, v in sorted(buckets.items())
    }


def send_lag_s(log: SessionLog) -> float:
    """The client's largest delay (s) sending a frame after it was due (the head's frames,
    sent ahead of real time, are not due at t0 + (k + 1) FRAME_S: left out)."""
    lags = [
        t - (log.t0 + (k + 1) * FRAME_S) for k, t in enumerate(log.sent) if k >= log.head_frames
    ]
    return max(lags, default=0.0)


def message_segments(msg: dict[str, Any]) -> list[tuple[float, float, int]] | None:
    """(start, end, word count) of the segments a server message carries; None for other
    messages."""
    kind = msg.get("type")
    if kind in ("segment.partial", "transcript.final"):
        segments = msg.get("segments", [])
    elif kind == "segment.final":
        segments = [msg]
    else:
        return None
    return [(float(s["start"]), float(s["end"]), len(str(s["text"]).split())) for s in segments]


def scripted_reference(forced_text: str) -> str:
    """The scripted backend's script (livemeet.backends.scripted.Script JSON) of a forced
    transcript: a server started with `--backend scripted --model {script}` emits the same
    segments as one running the forced output (tests of this benchmark, on the CPU)."""
    from livemeet.backends.scripted import Script
    from livemeet.transcript.parser import parse_transcript

    return Script(tuple(parse_transcript(forced_text))).to_json()


# ---------------------------------------------------------------- the client


async def _read(ws: aiohttp.ClientWebSocketResponse, log: SessionLog) -> None:
    await _read_messages(ws, log)
    if log.final_at is None and not log.error:
        log.error = f"closed without transcript.final (close code {ws.close_code})"
    elif log.revision == "pending":
        log.revision = "closed"


async def _read_messages(ws: aiohttp.ClientWebSocketResponse, log: SessionLog) -> None:
    """The session's events to its final transcript, or, where one was promised, to its
    revision (or the revision's error: the session itself succeeded)."""
    async for msg in ws:
        if msg.type != aiohttp.WSMsgType.TEXT:
            continue
        payload = json.loads(msg.data)
        kind = payload.get("type")
        if kind == "error" and log.revision == "pending":
            log.revision = "failed"
            return
        if kind == "error":
            log.error = log.error or f"{payload.get('code')}: {payload.get('message')}"
            return
        segments = message_segments(payload)
        if segments is not None:
            log.events.append((time.monotonic(), payload["type"], segments))
        if kind == "transcript.final":
            log.final_at = time.monotonic()
            if not log.revise:
                return
            log.revision = "pending"
        elif kind == "transcript.revised":
            log.revised_at = time.monotonic()
            log.revision = "revised"
            return


def final_wait_s(final_by: float | None, now: float) -> float:
    """s to wait for transcript.final after `end` (and for its revision, where one was
    promised: both within this wait): FINAL_TIMEOUT_S, cut to what is left before
    `final_by` (a monotonic time: the run's budget less a margin; at least MIN_FINAL_WAIT_S),
    so that an engine still catching up cannot hold the point past it with nothing recorded."""
    if final_by is None:
        return FINAL_TIMEOUT_S
    return max(MIN_FINAL_WAIT_S, min(FINAL_TIMEOUT_S, final_by - now))


async def live_session(
    session: aiohttp.ClientSession,
    url: str,
    samples: np.ndarray,
    delay_s: float,
    final_by: float | None = None,
    head_s: float = 0.0,
    head_speed: float = HEAD_SPEED,
    head_pause_s: float = 0.0,
) -> SessionLog:
    """Stream `samples` (16 kHz float32) in real time after `delay_s`, then `end`, and wait
    for the final transcript and, where `session.ready` promised one, its revision (both
    within `final_wait_s`: a revision not in by then is "late", not an error); the log. The
    first `head_s` (whole frames) go `head_speed` times faster than real time, then, after
    `head_pause_s` of keepalives (the server works off what the head queued), the rest in
    real time as if the head had been spoken at that speed just before: `log.t0` is set so
    that frame k after the head is due at t0 + (k + 1) FRAME_S."""
    log = SessionLog()
    await asyncio.sleep(delay_s)
    frame = round(FRAME_S * SAMPLE_RATE)
    try:
        opened = time.monotonic()
        async with session.ws_connect(url.replace("http", "ws", 1) + LIVE_PATH) as ws:
            await ws.send_json({"type": "start", "sample_rate": SAMPLE_RATE})
            ready = await ws.receive_json(timeout=READY_TIMEOUT_S)
            if ready.get("type") != "session.ready":
                log.error = f"no session.ready: {ready}"
                return log
            log.ready_s = time.monotonic() - opened
            log.revise = bool(ready.get("revise"))
            reader = asyncio.create_task(_read(ws, log))
            num_frames = math.ceil(samples.size / frame)
            log.head_frames = head = min(num_frames, round(head_s / FRAME_S))
            start = time.monotonic()
            log.t0 = start - head * FRAME_S * (1.0 - 1.0 / head_speed)
            if head and head_pause_s > 0:
                log.t0 += head_pause_s
            for k in range(num_frames):
                if k == head and head and head_pause_s > 0:
                    await _pause(ws, start + head * FRAME_S / head_speed + head_pause_s)
                if k < head:
                    due = start + (k + 1) * FRAME_S / head_speed
                else:
                    due = log.t0 + (k + 1) * FRAME_S
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await ws.send_bytes(wl.pcm16(samples[k * frame : (k + 1) * frame]))
                log.sent.append(time.monotonic())
            await ws.send_json({"type": "end"})
            log.end_sent = time.monotonic()
            wait_s = final_wait_s(final_by, log.end_sent)
            try:
                await asyncio.wait_for(reader, wait_s)
            except TimeoutError:
                if log.final_at is None:
                    log.error = f"no transcript.final within {wait_s:.0f} s of end"
                else:  # the final came: only its revision is missing
                    log.revision = "late"
    except Exception as exc:  # one failed session is reported, never aborts the point
        log.error = log.error or f"{type(exc).__name__}: {exc}"
    return log


async def _pause(ws: aiohttp.ClientWebSocketResponse, until: float) -> None:
    """Send nothing but keepalives until `until` (monotonic s)."""
    while (left := until - time.monotonic()) > 0:
        await asyncio.sleep(min(left, PAUSE_KEEPALIVE_S))
        if until - time.monotonic() > 0:
            await ws.send_json({"type": "keepalive"})


@dataclass
class UploadTally:
    """Uploads of one point's closed-loop clients: completed, failed, the first failure's
    description (status and body excerpt, an error event, or the client exception), and the
    audio seconds transcribed so far, finished uploads or not (each upload's furthest segment
    end received), which shows the uploads' progress when a point is too short to finish one."""

    completed: int = 0
    errors: int = 0
    first_error: str = ""
    transcribed_s: float = 0.0


async def streamed_upload(
    session: aiohttp.ClientSession, url: str, body: bytes, on_segment: Callable[[float], None]
) -> str:
    """POST one WAV with `stream=true`; `on_segment(end_s)` for each transcript segment as its
    server-sent event arrives. Returns "" or an error description."""
    form = aiohttp.FormData()
    form.add_field("file", body, filename="meeting.wav", content_type="audio/wav")
    form.add_field("model", "moss-transcribe-diarize")
    form.add_field("response_format", "json")
    form.add_field("stream", "true")
    try:
        async with session.post(url + ENDPOINT, data=form) as r:
            if r.status != 200:
                return f"HTTP {r.status}: {(await r.read())[:200]!r}"
            pending = b""
            async for chunk in r.content.iter_any():  # events can outgrow a line buffer
                pending += chunk
                *events, pending = pending.split(b"\n\n")
                for raw in events:
                    event = json.loads(raw.removeprefix(b"data: "))
                    if event.get("type") == "transcript.text.segment":
                        on_segment(float(event["end"]))
                    elif event.get("type") == "transcript.text.done":
                        return ""
                    elif "error" in event:  # the gateway's error body: {"error": {...}}
                        return f"error event: {str(event['error'])[:200]}"
            return "the stream ended without transcript.text.done"
    except (aiohttp.ClientError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


async def upload_loop(
    session: aiohttp.ClientSession, url: str, bodies: Iterator[bytes], tally: UploadTally
) -> None:
    """Upload the next of `bodies` (an iterator every client shares, so no two uploads in
    flight carry the same meeting) until cancelled: one closed-loop client."""
    while True:
        reached_s = 0.0

        def on_segment(end_s: float) -> None:
            nonlocal reached_s
            tally.transcribed_s += max(0.0, end_s - reached_s)
            reached_s = max(reached_s, end_s)

        error = await streamed_upload(session, url, next(bodies), on_segment)
        if error:
            tally.errors += 1
            tally.first_error = tally.first_error or error
        else:
            tally.completed += 1


# ---------------------------------------------------------------- a point


async def run_point(
    url: str,
    samples: np.ndarray,
    turns: Sequence[wl.Turn],
    reference: Sequence[Segment],
    num_sessions: int,
    num_uploads: int,
    duration_s: float,
    upload_audio_s: float,
    deadline: float | None = None,
    head_s: float = 0.0,
    head_speed: float = HEAD_SPEED,
    head_pause_s: float = 0.0,
) -> dict[str, Any]:
    """One point (module doc): its JSON record. `deadline` (monotonic): the sessions stop
    waiting for their finals FINAL_BUDGET_MARGIN_S before it (`final_wait_s`). `head_s`: each
    session's first seconds go `head_speed` times faster and only segments ending after
    them count (`live_session`), which then pauses `head_pause_s`; `engine_by_time` stays in
    seconds since the sessions started (`meeting_s` converts)."""
    final_by = None if deadline is None else deadline - FINAL_BUDGET_MARGIN_S
    audio = samples[: round(duration_s * SAMPLE_RATE)]
    tally = UploadTally()
    # built before the clock starts: a 37-minute WAV takes the client ~0.3 s to make
    bodies = [wl.wav_bytes(wl.vary(samples, 100 + j))
              for j in range(BODIES_PER_UPLOAD * num_uploads)]  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=None)
    # no connection limit: aiohttp's default of 100 would hold sessions past the 100th (with the
    # uploads) until earlier ones close, and measure a different, smaller point
    connector = aiohttp.TCPConnector(limit=0)
    # an API key, where set, on the uploads and the live upgrades alike (http_sweep)
    headers = auth_headers()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, headers=headers) as http:
        before = await scrape_metrics(http, url)
        shared = itertools.cycle(bodies)
        scrapes: list[tuple[float, str | None]] = []  # engine_by_time
        timeline: asyncio.Task[None] | None = None
        uploads_start = time.monotonic()
        uploads = [
            asyncio.create_task(upload_loop(http, url, shared, tally)) for _ in range(num_uploads)
        ]
        try:
            if uploads:
                await asyncio.sleep(UPLOAD_LEAD_S)
            start = time.monotonic()
            timeline = asyncio.create_task(
                scrape_every(lambda: scrape_metrics(http, url), LATENCY_BUCKET_S, start, scrapes)
            )
            logs = await asyncio.gather(
                *(
                    live_session(
                        http,
                        url,
                        wl.vary(audio, i + 1),
                        i / max(num_sessions, 1),
                        final_by,
                        head_s,
                        head_speed,
                        head_pause_s,
                    )  # fmt: skip
                    for i in range(num_sessions)
                )
            )
            end = time.monotonic()
        finally:
            tasks = [*uploads, *([timeline] if timeline is not None else [])]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        scrapes.append((time.monotonic() - start, await scrape_metrics(http, url)))  # the tail
        after = None if before is None else await settled_metrics(http, url)
    wall = end - start
    results = [segment_latencies(turns, log, audio.size / SAMPLE_RATE, head_s) for log in logs]
    lat = [x for r in results for x in r.latencies]
    words = [word_latencies(reference, log, audio.size / SAMPLE_RATE, head_s) for log in logs]
    word_lat = [x for r in words for x in r.latencies]
    errors = [log.error for log in logs if log.error]
    finals = [t for t in (log.final_after_end_s() for log in logs) if t is not None]
    revised = [t for t in (log.revised_after_end_s() for log in logs) if t is not None]
    readies = [log.ready_s for log in logs if log.ready_s is not None]
    return {
        "sessions": num_sessions,
        "uploads": num_uploads,
        "duration_s": duration_s,
        **(
            {"head_start_s": head_s, "head_speed": head_speed, "head_pause_s": head_pause_s}
            if head_s > 0
            else {}
        ),
        "segments_expected": sum(r.expected for r in results),
        "segments_seen": len(lat),
        "segments_live": len(lat) - sum(r.after_end for r in results),  # before `end`
        "segments_after_end": sum(r.after_end for r in results),
        "segments_missed": sum(r.missed for r in results),
        **latency_summary("latency", lat),
        # DESIGN 10's definition, per word (`word_latencies`); the fields above are per segment,
        # at its last word, as sessions 18-23 reported them
        "words_expected": sum(r.expected for r in words),
        "words_seen": len(word_lat),
        "words_missed": sum(r.missed for r in words),
        **latency_summary("word_latency", word_lat),
        # after a head, the same without the words of its catch-up (CATCH_UP_S)
        **(
            latency_summary("steady_word_latency", latencies_after(words, head_s + CATCH_UP_S))
            if head_s > 0
            else {}
        ),
        "send_lag_max_s": max((send_lag_s(log) for log in logs), default=0.0),
        "ready_p50_s": percentile(readies, 50) if readies else None,
        "ready_max_s": max(readies) if readies else None,
        "finals_received": len(finals),
        "final_after_end_p50_s": percentile(finals, 50) if finals else None,
        "final_after_end_max_s": max(finals) if finals else None,
        # where that went, by the server's livemeet_live_final_seconds: engine, hold (mean s)
        **final_phase_fields(before, after),
        **revision_fields(logs, revised),
        "num_errors": len(errors),
        "first_error": errors[0] if errors else "",
        "uploads_completed": tally.completed,
        "upload_errors": tally.errors,
        "upload_first_error": tally.first_error,
        # over the uploads' own time (they start UPLOAD_LEAD_S before the sessions)
        "upload_audio_s_per_s": tally.completed * upload_audio_s / (end - uploads_start),
        "upload_transcribed_audio_s": tally.transcribed_s,
        "upload_progress_audio_s_per_s": tally.transcribed_s / (end - uploads_start),
        "wall_s": wall,
        "latency_by_time": latency_by_time(results),
        "word_latency_by_time": latency_by_time(words),
        **engine_fields(engine_counters(before), engine_counters(after)),
        **({"engine_by_time": by_time} if (by_time := engine_by_time(scrapes)) else {}),
    }


def final_phase_fields(before: str | None, after: str | None) -> dict[str, Any]:
    """`final_phase_mean_s` from two /metrics scrapes: the mean seconds of the sessions'
    finals in each phase of livemeet_live_final_seconds (engine: `end` to the backend's
    final transcript; hold: its wait for the journal); none without both scrapes."""
    if before is None or after is None:
        return {}
    totals = (parse_phases(text, LIVE_FINAL_HISTOGRAM) for text in (before, after))
    return phase_fields(*totals, phases=LIVE_FINAL_PHASES, key="final_phase_mean_s")


def revision_fields(logs: Sequence[SessionLog], revised: Sequence[float]) -> dict[str, Any]:
    """The sessions' revisions (DESIGN 5.7): how many finals promised one, how each ended
    (`SessionLog.revision`), and the delay from `end` to transcript.revised of those that
    came (`revised`, s: p50, p95, max)."""
    outcomes = [log.revision for log in logs if log.revise and log.final_at is not None]
    return {
        "revisions_promised": len(outcomes),
        "revisions_received": outcomes.count("revised"),
        "revisions_failed": outcomes.count("failed"),
        "revisions_late": outcomes.count("late"),
        "revisions_closed": outcomes.count("closed"),
        "revised_after_end_p50_s": percentile(revised, 50) if revised else None,
        "revised_after_end_p95_s": percentile(revised, 95) if revised else None,
        "revised_after_end_max_s": max(revised) if revised else None,
    }


async def scrape_every(
    scrape: Callable[[], Awaitable[str | None]],
    every_s: float,
    start: float,
    into: list[tuple[float, str | None]],
) -> None:
    """Append (s since `start` (monotonic), `scrape()`'s text) to `into` at `start` and every
    `every_s` after it, until cancelled; a late scrape does not shift the later ones."""
    k = 0
    while True:
        await asyncio.sleep(max(0.0, start + k * every_s - time.monotonic()))
        into.append((time.monotonic() - start, await scrape()))
        k += 1


def engine_by_time(scrapes: Sequence[tuple[float, str | None]]) -> dict[str, dict[str, Any]]:
    """The engine counters' increase between consecutive scrapes (`scrape_every`), keyed
    "a-b" by their times (s, rounded); a pair without counters (failed scrape, a backend with
    no step engine, a restarted worker) is left out."""
    out: dict[str, dict[str, Any]] = {}
    for (t0, a), (t1, b) in itertools.pairwise(scrapes):
        fields = engine_fields(engine_counters(a), engine_counters(b))
        if fields:
            out[f"{round(t0)}-{round(t1)}"] = fields
    return out


def meeting_s(
    since_start_s: float,
    head_s: float = 0.0,
    head_speed: float = HEAD_SPEED,
    head_pause_s: float = 0.0,
) -> float:
    """Seconds of meeting streamed `since_start_s` after a session started with a head start
    of `head_s` at `head_speed` (the head takes head_s / head_speed s, then a pause of
    `head_pause_s` (none without a head), then real time)."""
    head_wall_s = head_s / head_speed
    if since_start_s <= head_wall_s:
        return since_start_s * head_speed
    pause_s = head_pause_s if head_s > 0 else 0.0
    return head_s + max(0.0, since_start_s - head_wall_s - pause_s)


# ---------------------------------------------------------------- the run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--sessions", type=parse_ints, default=[1, 16, 64], help="live sessions")
    p.add_argument("--uploads", type=parse_ints, default=[0, 2], help="long uploads beside")
    p.add_argument("--duration-s", type=float, default=60.0, help="audio per session, s")
    p.add_argument(
        "--head-start-s",
        type=float,
        default=0.0,
        help="s of each meeting streamed --head-speed times faster before real time; only "
        "segments ending after it count (a long meeting's late minutes within one call)",
    )
    p.add_argument("--head-speed", type=float, default=HEAD_SPEED, help="the head's speed-up")
    p.add_argument(
        "--head-pause-s",
        type=float,
        default=0.0,
        help="s each session waits after its head (keepalives only) before real time, so the "
        "server works off what the head queued (with --head-start-s)",
    )
    p.add_argument(
        "--long-audio-s",
        type=float,
        default=None,
        help="length of the long meeting (s; default its 2,240 s)",
    )
    p.add_argument(
        "--serve-args",
        default=DEFAULT_SERVE_ARGS,
        help="{forced}: the transcript's path; {script}: the same as a scripted-backend script",
    )
    p.add_argument("--url", default=None, help="use this running server (its forced output)")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--max-seconds", type=float, default=None, help="skip points past this")
    p.add_argument("--out", default="bench_live.jsonl", help="JSON lines output (appended)")
    p.add_argument("--log-dir", default=None, help="server log (default: next to --out)")
    return p.parse_args(argv)


async def amain(args: argparse.Namespace) -> None:
    from livemeet.models.tokenizer import load_tokenizer

    if args.head_start_s < 0 or args.head_speed < 1.0 or args.head_pause_s < 0:
        raise SystemExit("--head-start-s and --head-pause-s must be >= 0, --head-speed >= 1")
    deadline = None if args.max_seconds is None else time.monotonic() + args.max_seconds
    workload = wl.get_workload("long", args.long_audio_s)
    samples, forced = wl.make_forced(load_tokenizer(None), workload, seed=1)
    log_dir = Path(args.log_dir) if args.log_dir else Path(args.out).resolve().parent
    log_dir.mkdir(parents=True, exist_ok=True)
    with (
        open(args.out, "a", encoding="utf-8") as out,
        tempfile.TemporaryDirectory() as tmp,
        open(log_dir / "server-live.log", "wb") as server_log,
    ):
        server, url = None, args.url
        try:
            if url is None:
                forced_path = Path(tmp) / "forced-long.txt"
                forced_path.write_text(forced.text, encoding="utf-8")
                script_path = Path(tmp) / "script-long.json"
                script_path.write_text(scripted_reference(forced.text), encoding="utf-8")
                filled = args.serve_args.format(forced=forced_path, script=script_path)
                serve_args = shlex.split(filled)
                server = Server(serve_args, Path(tmp) / "data", server_log)
                ready_s = await server.wait_ready(args.startup_timeout)
                write_line(out, {"event": "server_ready", "ready_s": ready_s, "cmd": server.cmd})
                url = server.url
            # the client's own collections would delay the receive times it measures
            freeze_startup_heap()
            reference = parse_transcript(forced.text)
            await _points(
                args, url, samples, forced.turns, reference, workload.audio_s, deadline, out
            )
        finally:
            thaw_heap()
            if server is not None:
                server.stop()


async def _points(
    args: argparse.Namespace,
    url: str,
    samples: np.ndarray,
    turns: Sequence[wl.Turn],
    reference: Sequence[Segment],
    upload_audio_s: float,
    deadline: float | None,
    out: IO[str],
) -> None:
    for num_uploads in args.uploads:
        for num_sessions in args.sessions:
            head_s = min(args.head_start_s, args.duration_s)
            streamed_s = args.duration_s - head_s + head_s / args.head_speed
            streamed_s += args.head_pause_s if head_s > 0 else 0.0
            need = streamed_s + POINT_MARGIN_S + (UPLOAD_LEAD_S if num_uploads else 0.0)
            if deadline is not None and time.monotonic() + need > deadline:
                why = f"needs ~{need:.0f} s, {deadline - time.monotonic():.0f} s left"
                write_line(out, {"sessions": num_sessions, "uploads": num_uploads, "skipped": why})
                continue
            record = await run_point(
                url, samples, turns, reference, num_sessions, num_uploads, args.duration_s,
                upload_audio_s, deadline, head_s, args.head_speed, args.head_pause_s,
            )  # fmt: skip
            write_line(out, record)  # to --out and stdout


def main(argv: list[str] | None = None) -> None:
    asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    main()
