"""The live journal under many sessions: how long `audio.ack` waits for the disk.

Every live session's audio goes through one writer thread that appends and fdatasyncs each
session's file, then commits, every JOURNAL_COMMIT_INTERVAL_S (livemeet/gateway/live_journal.py);
an ack covers only audio that thread reported. This drives a LiveJournal in a temp dir (or
--dir) as a gateway would: N sessions, each appending a frame of `--frame-s` of 16-kHz mono
PCM every `--frame-s`, for `--seconds`, and reports the ack lag (from an append to the
on_durable report covering it) and the group commits' durations and sizes. With
`--finals-per-min F` each session also journals a final segment F times a minute (at random
ticks), as a live session's pump does; a final is shown to its client only once the journal
holds it, which commits its group at once: the final lag is from `add_final` to that.

    python -m loadtest.journal_load --sessions 100 --seconds 20 [--finals-per-min 15]
        [--dir /data/livemeet/live]

The figures are the disk's where it runs: run it on the serving machine's data dir.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from livemeet.audio.constants import JOURNAL_COMMIT_INTERVAL_S, PCM_S16LE_BYTES, SAMPLE_RATE
from livemeet.gateway.live_journal import JournalSession, LiveJournal
from livemeet.transcript.segments import Segment


class Session:
    """One simulated session: when each of its frames was appended, until reported durable."""

    def __init__(self) -> None:
        self.appended: deque[tuple[int, float]] = deque()  # (frames after the append, time)
        self.lags_s: list[float] = []

    def append(self, total_frames: int) -> None:
        """A frame was appended; the session then holds `total_frames` sample frames."""
        self.appended.append((total_frames, time.monotonic()))

    def durable(self, frames: int) -> None:
        """The journal's on_durable: every append up to `frames` gets its ack lag (s)."""
        now = time.monotonic()
        while self.appended and self.appended[0][0] <= frames:
            self.lags_s.append(now - self.appended.popleft()[1])


async def run(
    sessions: int, seconds: float, frame_s: float, root: Path, finals_per_min: float = 0.0
) -> dict[str, Any]:
    """`sessions` sessions appending `frame_s` s of 16-kHz mono PCM every `frame_s` s for
    `seconds` into a LiveJournal at `root`, each adding a final `finals_per_min` times a
    minute on average: the report (ack lag, final lag and commit percentiles in s, files per
    commit, fsyncs per s)."""
    commits: list[tuple[float, int]] = []
    final_lags: list[float] = []
    pending: list[asyncio.Task[None]] = []
    rng = random.Random(0)
    final_p = finals_per_min / 60.0 * frame_s  # chance a session adds a final at a tick

    async def final_lag(stored: asyncio.Future[None]) -> None:
        t0 = time.monotonic()
        await stored
        final_lags.append(time.monotonic() - t0)

    journal = LiveJournal(root, on_commit=lambda s, n: commits.append((s, n)))
    journal.load_unfinished()
    journal.start(asyncio.get_running_loop())
    frame_frames = round(frame_s * SAMPLE_RATE)
    pcm = bytes(frame_frames * PCM_S16LE_BYTES)
    sims = [Session() for _ in range(sessions)]
    for i, sim in enumerate(sims):
        meta = JournalSession(f"load-{i}", "r" * 64, "c" * 64, SAMPLE_RATE, 1, time.time())
        journal.open_session(meta, sim.durable, lambda error: None)
    started = time.monotonic()
    ticks = 0
    while time.monotonic() - started < seconds:
        ticks += 1
        for i, sim in enumerate(sims):
            journal.append_audio(f"load-{i}", pcm)
            sim.append(ticks * frame_frames)
            if rng.random() < final_p:
                t = ticks * frame_s
                segment = Segment(t - 3.0, t, "S01", "words " * 8, f"seg-{ticks:06d}", True)
                pending.append(
                    asyncio.ensure_future(final_lag(journal.add_final(f"load-{i}", segment)))
                )
        await asyncio.sleep(max(0.0, started + ticks * frame_s - time.monotonic()))
    await asyncio.gather(*pending)
    for i in range(sessions):
        journal.finish(f"load-{i}")
    await journal.close()
    lags = np.array([lag for sim in sims for lag in sim.lags_s])
    durations = np.array([s for s, _ in commits])
    files = np.array([n for _, n in commits])
    return {
        "sessions": sessions,
        "seconds": seconds,
        "frame_s": frame_s,
        "commit_interval_s": JOURNAL_COMMIT_INTERVAL_S,
        "appends": int(ticks * sessions),
        "acked_appends": int(lags.size),
        "ack_lag_s": percentiles(lags),
        "finals_per_min": finals_per_min,
        "finals": len(final_lags),
        "final_lag_s": percentiles(np.array(final_lags)) if final_lags else None,
        "commits": int(durations.size),
        "commit_s": percentiles(durations),
        "files_per_commit_mean": round(float(files.mean()), 1),
        "fsyncs_per_s": round(float(files.sum()) / seconds, 1),
    }


def run_points(
    sessions: list[int],
    directory: Path | None,
    json_path: Path | None,
    name: str,
    measure: Callable[[int, Path], Coroutine[Any, Any, dict[str, Any]]],
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(n, report) for each session count n of `sessions`: `measure(n, root)` run in its own
    event loop over `directory`/`name-n` (`directory` None: a temp dir, removed after), its
    report appended to `json_path` (if given) as one JSON line."""
    for n in sessions:
        with tempfile.TemporaryDirectory() as tmp:
            root = directory if directory is not None else Path(tmp)
            report = asyncio.run(measure(n, root / f"{name}-{n}"))
        if json_path is not None:
            with json_path.open("a") as f:
                f.write(json.dumps(report) + "\n")
        yield n, report


def lag_cell(lag: dict[str, float] | None) -> str:
    """A table cell of `percentiles`' p50 / p95 / max (s), or "-" where none was measured."""
    return "-" if lag is None else f"{lag['p50']} / {lag['p95']} / {lag['max']}"


def percentiles(values: np.ndarray) -> dict[str, float]:
    """p50, p95, p99 and max of `values`, rounded to 0.1 ms."""
    p50, p95, p99 = np.percentile(values, (50, 95, 99)).round(4).tolist()
    return {"p50": p50, "p95": p95, "p99": p99, "max": round(float(values.max()), 4)}


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring); prints a markdown table, one row per --sessions."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, nargs="+", default=[100])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--frame-s", type=float, default=0.1, help="s of audio per append")
    p.add_argument(
        "--finals-per-min",
        type=float,
        default=0.0,
        help="final segments a session journals a minute",
    )
    p.add_argument("--dir", type=Path, help="journal dir (default: a temp dir)")
    p.add_argument("--json", type=Path, help="append one JSON line per point")
    args = p.parse_args(argv)
    print("| sessions | appends/s | finals/s | ack lag p50 / p95 / p99 / max (s) | final lag "
          "p50 / p95 / max (s) | commits/s | commit p50 / p95 / max (s) | files / commit "
          "| fsyncs / s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")

    def measure(n: int, root: Path) -> Coroutine[Any, Any, dict[str, Any]]:
        return run(n, args.seconds, args.frame_s, root, args.finals_per_min)

    for n, report in run_points(args.sessions, args.dir, args.json, "journal", measure):
        lag, commit = report["ack_lag_s"], report["commit_s"]
        finals = lag_cell(report["final_lag_s"])
        print(
            f"| {n} | {report['appends'] / args.seconds:.0f} | "
            f"{report['finals'] / args.seconds:.1f} | {lag['p50']} / {lag['p95']} / "
            f"{lag['p99']} / {lag['max']} | {finals} | {report['commits'] / args.seconds:.1f} | "
            f"{commit['p50']} / {commit['p95']} / {commit['max']} | "
            f"{report['files_per_commit_mean']} | {report['fsyncs_per_s']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
