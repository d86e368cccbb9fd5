"""Which live VAD hears the AMI excerpts best, and what each costs (DESIGN 5.4: the default is
whichever measures better against the AMI RTTM in the shared data).

For WebRTC's VAD at modes 0-3 and Silero's at thresholds around faster-whisper's 0.5, streams the
three 30-s AMI excerpts of the shared data (`ami-pyannote-debug`: dev00, dev01, tst00) in
CHUNK_S chunks, as clients send them, through a live session's Endpointer
(livemeet/session/vad.py) with a fresh classifier per excerpt, and scores against the RTTM:

- frames: the share of the reference's speech the VAD calls silence (miss), of its non-speech
  the VAD calls speech (false alarm), and the F1 of speech, per sample over the classified
  frames of all three excerpts; and the share of each excerpt called speech;
- speech ends: of the reference's ends of speech followed by a pause of at least
  VAD_END_SILENCE_S (all speakers merged), those with an Endpointer end within MATCH_S (found),
  the Endpointer's ends whose following VAD_END_SILENCE_S the reference holds speech all
  through (inside speech), and the median wait from a found end to the chunk that reported it;
- hops: of the whole LIVE_HOP_S hops, those holding >= VAD_MIN_SPEECH_S of reference speech in
  which the VAD heard none (LiveSession would skip them once nothing waits to be committed:
  that speech is decoded up to LIVE_SILENCE_HOP_S late), and those without reference speech in
  which it heard some (a hop runs that could have been skipped);
- CPU: process CPU time of the Endpointer over the excerpts per second of audio (the least of
  `--repeats` runs), and that at 100 sessions as a share of one core.

The RTTM is turn-level (a turn holds its speaker's pauses), so part of every VAD's misses and
of its ends inside speech are pauses within a turn; 7 pause ends in 90 s is a small sample.

Usage: python -m loadtest.vad_study [--data ../shared/data] [--seconds 30] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from livemeet.audio.constants import LIVE_HOP_S, SAMPLE_RATE, VAD_END_SILENCE_S, VAD_MIN_SPEECH_S
from livemeet.eval.io import SpeakerTurn, parse_rttm
from livemeet.session.vad import (
    Endpointer,
    FrameClassifier,
    PcmFrames,
    SileroClassifier,
    webrtc_classifier,
)

CHUNK_S = 0.1  # s of audio per chunk fed, as loadtest.bench_live sends it
MATCH_S = 0.25  # s; an Endpointer end this close to a reference end finds it (md-eval's collar)
SESSIONS = 100  # live sessions one engine worker serves (DESIGN 10's target)
EXCERPTS = (("dev00", "development"), ("dev01", "development"), ("tst00", "test"))
WEBRTC_MODES = (0, 1, 2, 3)
SILERO_THRESHOLDS = (0.2, 0.3, 0.4, 0.5, 0.6)
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@dataclass(frozen=True)
class Excerpt:
    """One excerpt: 16 kHz float32 samples and its reference speaker turns."""

    name: str
    audio: np.ndarray
    turns: tuple[SpeakerTurn, ...]


@dataclass(frozen=True)
class Setting:
    """One VAD setting to measure: "webrtc" at a mode (0-3) or "silero" at a threshold."""

    vad: str
    value: float

    @property
    def label(self) -> str:
        return f"mode {self.value:g}" if self.vad == "webrtc" else f"threshold {self.value:g}"

    def classifier(self) -> FrameClassifier:
        """A fresh classifier (its state is one stream's)."""
        if self.vad == "webrtc":
            return PcmFrames(webrtc_classifier(int(self.value)))
        return SileroClassifier(threshold=self.value)


@dataclass
class Counts:
    """Sums over excerpts, in samples unless named otherwise."""

    ref_speech: int = 0  # reference speech (any speaker)
    ref_silence: int = 0
    hits: int = 0  # reference speech the VAD calls speech
    false_alarm: int = 0  # reference non-speech the VAD calls speech
    targets: int = 0  # reference ends followed by a pause >= VAD_END_SILENCE_S
    found: int = 0  # of them, with an Endpointer end within MATCH_S
    ends: int = 0  # Endpointer ends
    inside: int = 0  # of them, with reference speech all through their judged silence
    speech_hops: int = 0  # whole hops with >= VAD_MIN_SPEECH_S of reference speech
    speech_hops_skipped: int = 0  # of them, heard as silence (a hop over them is skipped)
    silent_hops: int = 0  # whole hops without reference speech
    silent_hops_run: int = 0  # of them, heard as speech (a hop over them runs)


@dataclass(frozen=True)
class Result:
    """One setting's figures over all excerpts (module docstring)."""

    speech_pct: tuple[float, ...]  # % of each excerpt called speech
    counts: Counts
    wait_p50_s: float  # median wait from a found reference end to the chunk reporting it
    cpu_ms_per_s: float  # process CPU per second of audio

    @property
    def miss(self) -> float:
        """Of the reference's speech, the share called silence."""
        return 1.0 - self.counts.hits / max(self.counts.ref_speech, 1)

    @property
    def false_alarm(self) -> float:
        """Of the reference's non-speech, the share called speech."""
        return self.counts.false_alarm / max(self.counts.ref_silence, 1)

    @property
    def f1(self) -> float:
        """F1 of speech: hits over the mean of reference and hypothesis speech."""
        c = self.counts
        said = c.hits + c.false_alarm
        return 2 * c.hits / (c.ref_speech + said) if c.hits else 0.0


class Recorder:
    """A FrameClassifier that keeps the decisions of the one it wraps."""

    def __init__(self, inner: FrameClassifier) -> None:
        self.inner = inner
        self.frame_samples = inner.frame_samples
        self.decisions: list[np.ndarray] = []

    def classify(self, frames: np.ndarray) -> np.ndarray:
        out = self.inner.classify(frames)
        self.decisions.append(out)
        return out


def load_excerpts(data: Path, seconds: float) -> list[Excerpt]:
    """The AMI excerpts under `data`, each cut to its first `seconds`."""
    folder = data / "ami-pyannote-debug"
    out = []
    for name, split in EXCERPTS:
        audio, rate = sf.read(folder / f"{name}.wav", dtype="float32")
        if rate != SAMPLE_RATE or audio.ndim != 1:
            raise ValueError(f"{name}.wav: expected 16 kHz mono, got {rate} Hz {audio.shape}")
        rttm = folder / f"debug.{split}.rttm"
        turns = parse_rttm(rttm.read_text(encoding="utf-8"), str(rttm))
        mine = tuple(t for t in turns if t.session == name and t.start_s < seconds)
        out.append(Excerpt(name, audio[: round(seconds * SAMPLE_RATE)], mine))
    return out


def speech_mask(turns: Iterable[SpeakerTurn], num_samples: int) -> np.ndarray:
    """bool [num_samples]: True where any speaker talks."""
    mask = np.zeros(num_samples, dtype=bool)
    for t in turns:
        mask[round(t.start_s * SAMPLE_RATE) : round(t.end_s * SAMPLE_RATE)] = True
    return mask


def pause_ends(mask: np.ndarray, min_pause_s: float) -> list[int]:
    """Sample indices where speech in `mask` stops and a pause of at least `min_pause_s`
    follows within the mask (one reaching the mask's end counts if that long)."""
    edges = np.flatnonzero(np.diff(mask.astype(np.int8)))
    stops = [int(i) + 1 for i in edges if mask[i]]
    starts = [int(i) + 1 for i in edges if not mask[i]]
    min_pause = round(min_pause_s * SAMPLE_RATE)
    out = []
    for stop in stops:
        following = next((s for s in starts if s > stop), mask.size)
        if following - stop >= min_pause:
            out.append(stop)
    return out


@dataclass(frozen=True)
class Run:
    """One excerpt streamed through an Endpointer."""

    ends: list[tuple[int, int]]  # (end sample, audio edge in samples when it was reported)
    heard: list[bool]  # per whole LIVE_HOP_S of audio: would a hop over it run (not skipped)?
    endpointer: Endpointer


def run_endpointer(classifier: FrameClassifier, audio: np.ndarray, chunk: int) -> Run:
    """Feed `audio` in chunks of `chunk` samples; a hop over [a, b) counts as heard when, with
    the audio fed up to b, the last speech heard ends less than an end's silence before a
    (LiveSession.silence_skipped's test; hop edges rounded up to a chunk)."""
    ep = Endpointer(classifier)
    hop = round(LIVE_HOP_S * SAMPLE_RATE)
    ends: list[tuple[int, int]] = []
    heard: list[bool] = []
    for i in range(0, audio.size, chunk):
        ep.feed(audio[i : i + chunk])
        if ep.last_end is not None and ep.num_ends > len(ends):
            ends.append((ep.last_end, ep.num_samples))
        while ep.num_samples >= (len(heard) + 1) * hop:
            start = len(heard) * hop
            heard.append(
                ep.last_speech_end > 0 and ep.last_speech_end + ep.end_silence_samples > start
            )
    return Run(ends, heard, ep)


def measure(setting: Setting, excerpts: Sequence[Excerpt], repeats: int) -> Result:
    """`setting`'s figures over `excerpts` (module docstring)."""
    counts = Counts()
    speech_pct = []
    waits: list[int] = []
    for ex in excerpts:
        recorder = Recorder(setting.classifier())
        run = run_endpointer(recorder, ex.audio, round(CHUNK_S * SAMPLE_RATE))
        frames = np.concatenate(recorder.decisions) if recorder.decisions else np.zeros(0, bool)
        hyp = np.repeat(frames, recorder.frame_samples)  # the classified samples only
        ref = speech_mask(ex.turns, ex.audio.size)
        speech_pct.append(100.0 * hyp.mean() if hyp.size else 0.0)
        _score_frames(counts, hyp, ref[: hyp.size])
        waits += _score_ends(counts, run.ends, ref)
        _score_hops(counts, run.heard, ref)
    return Result(
        speech_pct=tuple(speech_pct),
        counts=counts,
        wait_p50_s=float(np.median(waits)) / SAMPLE_RATE if waits else float("nan"),
        cpu_ms_per_s=cpu_cost(setting, excerpts, repeats),
    )


def _score_frames(counts: Counts, hyp: np.ndarray, ref: np.ndarray) -> None:
    counts.ref_speech += int(ref.sum())
    counts.ref_silence += int((~ref).sum())
    counts.hits += int(np.sum(hyp & ref))
    counts.false_alarm += int(np.sum(hyp & ~ref))


def _score_ends(counts: Counts, ends: Sequence[tuple[int, int]], ref: np.ndarray) -> list[int]:
    """Count found and inside ends; the waits (samples) of the found ones. Each reference
    end takes the nearest Endpointer end within MATCH_S that no earlier one took."""
    match = round(MATCH_S * SAMPLE_RATE)
    end_silence = round(VAD_END_SILENCE_S * SAMPLE_RATE)
    wanted = pause_ends(ref, VAD_END_SILENCE_S)
    counts.targets += len(wanted)
    taken: set[int] = set()
    waits = []
    for t in wanted:
        near = [(abs(e - t), k) for k, (e, _) in enumerate(ends) if k not in taken]
        near = [(d, k) for d, k in near if d <= match]
        if near:
            k = min(near)[1]
            taken.add(k)
            waits.append(ends[k][1] - t)
    counts.found += len(waits)
    counts.ends += len(ends)
    counts.inside += sum(bool(ref[e : e + end_silence].all()) for e, _ in ends)
    return waits


def _score_hops(counts: Counts, heard: Sequence[bool], ref: np.ndarray) -> None:
    hop = round(LIVE_HOP_S * SAMPLE_RATE)
    min_speech = round(VAD_MIN_SPEECH_S * SAMPLE_RATE)
    for k, ran in enumerate(heard):
        speech = int(ref[k * hop : (k + 1) * hop].sum())
        if speech >= min_speech:
            counts.speech_hops += 1
            counts.speech_hops_skipped += not ran
        elif speech == 0:
            counts.silent_hops += 1
            counts.silent_hops_run += ran


def cpu_cost(setting: Setting, excerpts: Sequence[Excerpt], repeats: int) -> float:
    """ms of process CPU per second of audio for a fresh Endpointer per excerpt fed in
    CHUNK_S chunks: the least of `repeats` runs (other work on the machine only adds)."""
    chunk = round(CHUNK_S * SAMPLE_RATE)
    seconds = sum(ex.audio.size for ex in excerpts) / SAMPLE_RATE
    best = float("inf")
    for _ in range(max(repeats, 1)):
        classifiers = [setting.classifier() for _ in excerpts]  # built outside the timing
        start = time.process_time()
        for ex, classifier in zip(excerpts, classifiers, strict=True):
            run_endpointer(classifier, ex.audio, chunk)
        best = min(best, time.process_time() - start)
    return 1000.0 * best / seconds


def settings(silero: bool) -> list[Setting]:
    """The settings measured: WebRTC's modes, then (when asked) Silero's thresholds."""
    out = [Setting("webrtc", m) for m in WEBRTC_MODES]
    if silero:
        out += [Setting("silero", t) for t in SILERO_THRESHOLDS]
    return out


def table(excerpts: Sequence[Excerpt], rows: Iterable[tuple[Setting, Result]]) -> list[str]:
    """The measurement as markdown table lines."""
    ref_pct = " / ".join(
        f"{100.0 * speech_mask(ex.turns, ex.audio.size).mean():.0f}" for ex in excerpts
    )
    names = " / ".join(ex.name for ex in excerpts)
    lines = [
        f"| VAD | setting | speech % ({names}; RTTM {ref_pct}) | miss % | false alarm % | F1 | "
        f"ends found (within {MATCH_S:g} s) | ends inside RTTM speech / all | wait p50 (s) | "
        f"1-s hops with speech skipped | silent 1-s hops run | CPU ms per audio s | "
        f"at {SESSIONS} sessions, % of a core |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s, r in rows:
        c = r.counts
        pct = " / ".join(f"{p:.0f}" for p in r.speech_pct)
        lines.append(
            f"| {s.vad} | {s.label} | {pct} | {100 * r.miss:.1f} | {100 * r.false_alarm:.1f} | "
            f"{r.f1:.3f} | {c.found} / {c.targets} | {c.inside} / {c.ends} | "
            f"{r.wait_p50_s:.2f} | {c.speech_hops_skipped} / {c.speech_hops} | "
            f"{c.silent_hops_run} / {c.silent_hops} | {r.cpu_ms_per_s:.2f} | "
            f"{r.cpu_ms_per_s * SESSIONS / 10.0:.1f} |"
        )
    return lines


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--seconds", type=float, default=30.0, help="of each excerpt (s)")
    parser.add_argument("--repeats", type=int, default=5, help="CPU timing runs (the least)")
    parser.add_argument("--no-silero", action="store_true", help="WebRTC only")
    args = parser.parse_args(None if argv is None else list(argv))
    excerpts = load_excerpts(args.data, args.seconds)
    rows = [(s, measure(s, excerpts, args.repeats)) for s in settings(not args.no_silero)]
    print("\n".join(table(excerpts, rows)))


if __name__ == "__main__":
    main()
