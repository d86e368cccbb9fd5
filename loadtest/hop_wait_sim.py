"""How long a segment's end waits for the first hop that covers it, without a model.

A segment's partial latency starts with the wait from the moment its end is spoken to the start
of the first hop whose audio reaches it; the hop's own time comes after. This streams the
benchmark's synthetic meeting (loadtest.workloads: turns of 3-6 s, pauses of 0-0.4 s) in
FRAME_S frames through a LiveSession, with or without its VAD endpointer, and runs each hop
for a fixed `hop_time_s` (one hop at a time, as MossCore runs a session), then reports the
wait per turn end. No GPU, no model: the hypotheses are empty, so nothing commits and the VAD
alone moves hops.

Hops that take long hold the VAD back: a speech end heard while a hop runs waits for it, and
the early hop then restarts the count to the next whole hop.

Usage: python -m loadtest.hop_wait_sim [--seconds 300] [--hop-times 0.3,0.5,0.8]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.session.live import LiveOptions, LiveSession
from livemeet.session.vad import Endpointer, LiveVad, live_classifier
from loadtest import workloads as wl

FRAME_S = 0.1  # s of audio per frame, as loadtest.bench_live sends it
TAIL_MARGIN_S = 2.0  # s; turn ends this close to the end may have no hop after them


@dataclass(frozen=True)
class HopWaits:
    """One run: hops started, of them due early (speech ends), and the wait (s) of each turn
    end from its moment to the start of the first hop whose audio edge reaches it."""

    hops: int
    early_hops: int
    waits_s: tuple[float, ...]

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100) of the waits, in s."""
        return float(np.percentile(self.waits_s, q))


def simulate(
    audio: np.ndarray, turns: Iterable[wl.Turn], hop_time_s: float, vad: bool, hop_s: float = 1.0
) -> HopWaits:
    """Stream `audio` (16 kHz float32) in frames; hops take `hop_time_s` each. Raises
    ValueError for a negative hop time."""
    if hop_time_s < 0:
        raise ValueError(f"hop_time_s must be >= 0, not {hop_time_s}")
    endpointer = Endpointer(live_classifier(LiveVad.WEBRTC)) if vad else None
    live = LiveSession(LiveOptions(hop_s=hop_s), endpointer)
    frame = round(FRAME_S * SAMPLE_RATE)
    busy_until: float | None = None
    starts: list[tuple[float, float]] = []  # (wall s, audio edge s) of each hop
    early = 0
    for i in range(0, len(audio), frame):
        live.receive_audio(audio[i : i + frame])
        now = min(i + frame, len(audio)) / SAMPLE_RATE  # real time: the audio's own clock
        if busy_until is not None and now >= busy_until - 1e-9:
            live.apply_hypothesis([])
            busy_until = None
        if busy_until is None and live.hop_due():
            early += live.hop_due_early()
            starts.append((now, live.window().end_s))
            busy_until = now + hop_time_s
    end_s = len(audio) / SAMPLE_RATE
    waits = []
    for turn in turns:
        if turn.end_s > end_s - TAIL_MARGIN_S:
            continue
        first = next((t for t, edge in starts if edge >= turn.end_s - 1e-6), None)
        if first is not None:
            waits.append(first - turn.end_s)
    return HopWaits(len(starts), early, tuple(waits))


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="meeting length (s)")
    parser.add_argument("--hop-times", default="0.3,0.5,0.8", help="hop durations (s), commas")
    args = parser.parse_args(None if argv is None else list(argv))
    turns = wl.plan_turns(args.seconds, 0)
    audio = wl.synthetic_audio(args.seconds, 0, turns)
    print("| VAD | hop time (s) | hops | early hops | turn ends | wait p50 / p95 / mean (s) |")
    print("|---|---|---|---|---|---|")
    for vad in (False, True):
        for hop_time_s in (float(x) for x in args.hop_times.split(",")):
            r = simulate(audio, turns, hop_time_s, vad)
            print(
                f"| {'on' if vad else 'off'} | {hop_time_s:g} | {r.hops} | {r.early_hops} | "
                f"{len(r.waits_s)} | {r.percentile(50):.2f} / {r.percentile(95):.2f} / "
                f"{float(np.mean(r.waits_s)):.2f} |"
            )


if __name__ == "__main__":
    main()
