"""Live sessions' pumps over the live journal: how long a partial waits behind finals.

A live session's pump (livemeet/gateway/live_holder.py) shows a final only once the journal
holds it, and nothing the session sends after a final overtakes it. This drives N
`LiveSessionHolder`s, each over a scripted backend session, with one real `LiveJournal` in a
temp dir (or --dir): each session journals a frame of audio every `--frame-s`, as a client's
frames come, and every `--hop-s` (phases spread over the sessions) emits `--burst` finals (a
backend catching up decodes several at once) then a partial. It reports the lag from the
backend's event to the socket's delivery, for finals and for the partial after them, with the
group commits' count. `--fsync-ms D` adds D ms to every fdatasync of the journal, as a slower
disk's (a cloud volume's few ms a sync).

    python -m loadtest.pump_load --sessions 50 --seconds 20 [--burst 4] [--fsync-ms 2]
        [--dir /data/livemeet/live]

The figures are the disk's where it runs: run it on the serving machine's data dir.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import numpy as np

from livemeet.audio.constants import PCM_S16LE_BYTES, SAMPLE_RATE
from livemeet.audio.pcm import PcmStreamDecoder
from livemeet.errors import StorageFailed
from livemeet.gateway import live_journal_writer
from livemeet.gateway.live_holder import LiveSessionHolder
from livemeet.gateway.live_journal import JournalSession, LiveJournal
from livemeet.gateway.live_protocol import PCM_ENCODING, AudioFormat
from livemeet.gateway.live_replay import SessionEvent
from livemeet.gateway.session_tokens import SessionTokens
from livemeet.transcriber import Event, SegmentFinal, SegmentPartial
from livemeet.transcript.segments import Segment
from loadtest.journal_load import lag_cell, percentiles, run_points

DRAIN_TIMEOUT_S = 30.0  # s; longest wait after the load for events still behind a commit


class ScriptedSession:
    """A backend session whose events the load puts (TranscriberSession: events and abort)."""

    def __init__(self, session_id: str) -> None:
        self._id = session_id
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()

    @property
    def id(self) -> str:
        return self._id

    async def abort(self) -> None:
        self.queue.put_nowait(None)

    async def events(self) -> AsyncIterator[Event]:
        while (event := await self.queue.get()) is not None:
            yield event


class TimingSink:
    """The client's socket: the lag of each final and partial from its emission (s), keyed
    by its first segment's start (unique in this load)."""

    def __init__(self, emitted: dict[float, float]) -> None:
        self.emitted = emitted
        self.final_lags: list[float] = []
        self.partial_lags: list[float] = []

    def attached(
        self, holder: LiveSessionHolder, replay: list[SessionEvent], resumed: bool
    ) -> None:
        pass

    def deliver(self, event: SessionEvent) -> None:
        now = time.monotonic()
        if isinstance(event, SegmentFinal):
            self.final_lags.append(now - self.emitted.pop(event.segment.start_s))
        elif isinstance(event, SegmentPartial):
            self.partial_lags.append(now - self.emitted.pop(event.segments[0].start_s))

    def take_over(self) -> asyncio.Task[None]:
        raise AssertionError("no resume in this load")

    def audio_durable(self) -> None:
        pass

    def storage_failed(self, error: StorageFailed) -> bool:
        return True  # ended early: its client's `end` had not come


async def run(
    sessions: int, seconds: float, hop_s: float, burst: int, root: Path, frame_s: float = 0.1
) -> dict[str, Any]:
    """`sessions` holders over one journal at `root` for `seconds`, each journalling a frame
    of `frame_s` s of audio every `frame_s` s and emitting `burst` finals and a partial every
    `hop_s` s: the report (lags in s, percentiles)."""
    commits: list[int] = []
    journal = LiveJournal(root, on_commit=lambda s, n: commits.append(n))
    journal.load_unfinished()
    journal.start(asyncio.get_running_loop())
    fmt = AudioFormat(SAMPLE_RATE, 1, PCM_ENCODING)
    pcm = bytes(round(frame_s * SAMPLE_RATE) * PCM_S16LE_BYTES)
    emitted: list[dict[float, float]] = [{} for _ in range(sessions)]
    sinks = [TimingSink(e) for e in emitted]
    holders: list[tuple[LiveSessionHolder, ScriptedSession]] = []
    for i, sink in enumerate(sinks):
        session = ScriptedSession(f"pump-{i}")
        meta = JournalSession(session.id, "r" * 64, "c" * 64, SAMPLE_RATE, 1, time.time())
        journal.open_session(meta, lambda frames: None, lambda error: None)
        decoder = PcmStreamDecoder(SAMPLE_RATE, 1, PCM_ENCODING)
        holder = LiveSessionHolder(
            session, decoder, fmt, SessionTokens.new(), lambda _: None, journal=journal
        )
        holder.attach(sink, resumed=False)
        holders.append((holder, session))

    async def emit(i: int) -> None:
        holder, session = holders[i]
        await asyncio.sleep(hop_s * i / sessions)
        started, tick, hop = time.monotonic(), 0, 0
        while time.monotonic() - started < seconds:
            journal.append_audio(holder.id, pcm)
            tick += 1
            if tick * frame_s >= (hop + 1) * hop_s:
                hop += 1
                hop_events(i, session, hop)
            await asyncio.sleep(max(0.0, started + tick * frame_s - time.monotonic()))

    def hop_events(i: int, session: ScriptedSession, hop: int) -> None:
        """The backend's events of one hop: `burst` finals, then the partial after them."""
        now, t = time.monotonic(), hop * hop_s
        for k in range(burst):
            start_s = t + k * hop_s / (burst + 1)
            segment = Segment(start_s, start_s + 0.1, "S01", "words " * 8, f"seg-{hop}-{k}", True)
            emitted[i][start_s] = now
            session.queue.put_nowait(SegmentFinal(segment))
        partial_s = t + burst * hop_s / (burst + 1)
        emitted[i][partial_s] = now
        tail = Segment(partial_s, partial_s + 0.1, "S01", "going on")
        session.queue.put_nowait(SegmentPartial(hop, (tail,)))

    await asyncio.gather(*(emit(i) for i in range(sessions)))
    drained_by = time.monotonic() + DRAIN_TIMEOUT_S
    while any(emitted) and time.monotonic() < drained_by:  # the last commits
        await asyncio.sleep(0.01)
    for holder, _ in holders:
        holder.dropped = True
        await holder.release()
        holder.close_journal(finished=True)
    await journal.close()
    finals = np.array([lag for s in sinks for lag in s.final_lags])
    partials = np.array([lag for s in sinks for lag in s.partial_lags])
    return {
        "sessions": sessions,
        "seconds": seconds,
        "hop_s": hop_s,
        "frame_s": frame_s,
        "burst": burst,
        "finals": int(finals.size),
        "final_lag_s": percentiles(finals) if finals.size else None,
        "partials": int(partials.size),
        "partial_lag_s": percentiles(partials) if partials.size else None,
        "commits": len(commits),
    }


def slow_fdatasync(delay_s: float) -> None:
    """Make every fdatasync of the journal's writer take `delay_s` longer (this process)."""
    real = live_journal_writer.os.fdatasync

    def fdatasync(fd: int) -> None:
        time.sleep(delay_s)
        real(fd)

    live_journal_writer.os.fdatasync = fdatasync  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring); prints a markdown table, one row per --sessions."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, nargs="+", default=[50])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--hop-s", type=float, default=1.0, help="s between a session's hops")
    p.add_argument("--burst", type=int, default=4, help="finals each hop emits")
    p.add_argument("--frame-s", type=float, default=0.1, help="s of audio per append")
    p.add_argument("--fsync-ms", type=float, default=0.0, help="ms added to each fdatasync")
    p.add_argument("--dir", type=Path, help="journal dir (default: a temp dir)")
    p.add_argument("--json", type=Path, help="append one JSON line per point")
    args = p.parse_args(argv)
    if args.fsync_ms > 0:
        slow_fdatasync(args.fsync_ms / 1000.0)
    print("| sessions | burst | final lag p50 / p95 / max (s) | partial lag p50 / p95 / max (s) "
          "| commits/s |")  # fmt: skip
    print("|---|---|---|---|---|")

    def measure(n: int, root: Path) -> Coroutine[Any, Any, dict[str, Any]]:
        return run(n, args.seconds, args.hop_s, args.burst, root, args.frame_s)

    for n, report in run_points(args.sessions, args.dir, args.json, "pump", measure):
        final, partial = lag_cell(report["final_lag_s"]), lag_cell(report["partial_lag_s"])
        print(
            f"| {n} | {args.burst} | {final} | {partial} | {report['commits'] / args.seconds:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
