"""Benchmark workloads (DESIGN.md section 10): synthetic meetings and their forced transcripts.

"long" = 2,240 s meetings with 330 output tokens per audio minute (12,320 tokens); "short" =
11.6 s clips with 64 output tokens. The audio is made with numpy alone (no espeak/sox on the GPU
box): a noise floor plus, for each speaker turn, a harmonic tone at that speaker's pitch with a
4 Hz syllable envelope. Its content is irrelevant (random weights); it only must not be silence.

The forced transcript is the model's output grammar (MODEL.md section 6),
`[start][Sxx] text[end][start][Sxx] text[end]...`, with turns of 3-6 s and 2-4 speakers, built so
that its canonical tokenization has exactly `num_output_tokens - 1` ids: with the EOS the engine
appends once the forced ids run out, a request emits exactly `num_output_tokens` tokens.
"""

from __future__ import annotations

import io
import wave
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from livemeet.audio.constants import SAMPLE_RATE
from livemeet.cli.live_client import to_pcm16

LONG_AUDIO_S = 2_240.0  # s; a 37.3-minute meeting (DESIGN section 10)
SHORT_AUDIO_S = 11.6  # s; a short clip (DESIGN section 10)
LONG_TOKENS_PER_AUDIO_MIN = 330  # output tokens per audio minute on dense meetings (DESIGN 10)
SHORT_OUTPUT_TOKENS = 64  # output tokens per short clip (DESIGN section 10)
TURN_MIN_S, TURN_MAX_S = 3.0, 6.0  # s; clause-sized segments (MODEL.md section 6)
TURN_GAP_MAX_S = 0.4  # s; longest pause between two turns
MIN_SPEAKERS, MAX_SPEAKERS = 2, 4
NOISE_RMS = 0.01  # full scale; the floor under and between turns
TONE_PEAK = 0.25  # full scale; peak amplitude of a voiced turn
SYLLABLE_HZ = 4.0  # Hz; envelope rate of the voiced tones (about a syllable rate)
SPEAKER_PITCH_HZ = (120.0, 210.0, 165.0, 260.0)  # Hz; fundamental of S01..S04
# Filler words; each is checked to be one token with its leading space.
WORDS = (
    " we",
    " can",
    " the",
    " and",
    " so",
    " that",
    " is",
    " it",
    " to",
    " of",
    " in",
    " this",
    " for",
    " on",
    " with",
    " have",
    " be",
    " what",
    " think",
    " about",
    " will",
    " next",
    " week",
    " plan",
    " team",
    " data",
    " model",
    " yes",
    " right",
    " okay",
    " good",
    " time",
)


@dataclass(frozen=True)
class Workload:
    """One benchmark workload: `audio_s` seconds of audio, `num_output_tokens` output tokens
    (EOS included) per request."""

    name: str
    audio_s: float
    num_output_tokens: int


def long_output_tokens(audio_s: float) -> int:
    """330 tokens per audio minute, rounded: 12,320 for 2,240 s."""
    return round(LONG_TOKENS_PER_AUDIO_MIN * audio_s / 60.0)


WORKLOADS = {
    "long": Workload("long", LONG_AUDIO_S, long_output_tokens(LONG_AUDIO_S)),
    "short": Workload("short", SHORT_AUDIO_S, SHORT_OUTPUT_TOKENS),
}


def get_workload(name: str, audio_s: float | None = None) -> Workload:
    """The named workload, optionally at another duration (tests, smaller runs); the output
    tokens of "long" then follow the 330-per-minute rate. Raises KeyError for unknown names."""
    base = WORKLOADS[name]
    if audio_s is None or audio_s == base.audio_s:
        return base
    tokens = long_output_tokens(audio_s) if name == "long" else base.num_output_tokens
    return Workload(name, audio_s, max(tokens, 2))


@dataclass(frozen=True)
class Turn:
    """One speaker turn: speaker index (0 = S01), start and end in seconds."""

    speaker: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class ForcedTranscript:
    """A reference transcript: its text and canonical token ids (EOS not included)."""

    text: str
    token_ids: tuple[int, ...]
    turns: tuple[Turn, ...]


def plan_turns(duration_s: float, seed: int) -> list[Turn]:
    """Turns of 3-6 s with pauses up to 0.4 s covering [0, duration_s], 2-4 speakers picked
    at random (never the same speaker twice in a row). Raises ValueError for duration <= 0."""
    if duration_s <= 0:
        raise ValueError(f"duration must be > 0 s, not {duration_s}")
    rng = np.random.default_rng(seed)
    num_speakers = int(rng.integers(MIN_SPEAKERS, MAX_SPEAKERS + 1))
    turns: list[Turn] = []
    t, speaker = 0.0, 0
    while t < duration_s - 0.5:
        start = round(t, 2)
        end = round(min(duration_s, start + rng.uniform(TURN_MIN_S, TURN_MAX_S)), 2)
        turns.append(Turn(speaker, start, end))
        t = end + rng.uniform(0.0, TURN_GAP_MAX_S)
        speaker = (speaker + int(rng.integers(1, num_speakers))) % num_speakers
    return turns or [Turn(0, 0.0, round(duration_s, 2))]


def synthetic_audio(
    duration_s: float, seed: int, turns: Sequence[Turn] | None = None
) -> np.ndarray:
    """float32 [round(duration_s * 16000)] mono samples in [-1, 1]: noise plus a harmonic tone
    per turn (pitch by speaker, 4 Hz envelope). `turns` defaults to plan_turns(duration, seed)."""
    n = int(round(duration_s * SAMPLE_RATE))
    rng = np.random.default_rng(seed)
    audio = rng.standard_normal(n, dtype=np.float32) * np.float32(NOISE_RMS)
    for turn in turns if turns is not None else plan_turns(duration_s, seed):
        lo, hi = int(turn.start_s * SAMPLE_RATE), min(n, int(turn.end_s * SAMPLE_RATE))
        if hi <= lo:
            continue
        t = np.arange(hi - lo, dtype=np.float32) / np.float32(SAMPLE_RATE)
        f0 = SPEAKER_PITCH_HZ[turn.speaker % len(SPEAKER_PITCH_HZ)]
        tone = np.sin(2 * np.pi * f0 * t) + 0.5 * np.sin(2 * np.pi * 2 * f0 * t)
        envelope = 0.5 * (1 - np.cos(2 * np.pi * SYLLABLE_HZ * t))
        audio[lo:hi] += (TONE_PEAK / 1.5) * tone * envelope
    np.clip(audio, -1.0, 1.0, out=audio)
    return audio


def vary(samples: np.ndarray, index: int) -> np.ndarray:
    """A cheap distinct copy of `samples` (rotated by a per-index offset), so that requests made
    from one base meeting never hit the encoder's window cache."""
    if index == 0:
        return samples
    return np.roll(samples, 7_919 * index)


def pcm16(samples: np.ndarray) -> bytes:
    """float32 samples in [-1, 1] (clipped) as little-endian PCM16 bytes: the conversion
    `livemeet stream` sends with (scaled by 32767, rounded), so the load test's live audio is
    the CLI's to the last bit."""
    return to_pcm16(samples)


def wav_bytes(samples: np.ndarray) -> bytes:
    """A 16 kHz mono PCM16 WAV file of float32 `samples` (stdlib `wave`, no soundfile)."""
    pcm = pcm16(samples)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm)
    return buf.getvalue()


def forced_transcript(
    tokenizer: Tokenizer, turns: Sequence[Turn], num_output_tokens: int, seed: int = 0
) -> ForcedTranscript:
    """The transcript of `turns` whose canonical tokenization is `num_output_tokens - 1` ids.

    Every turn gets >= 1 word; when even that is too long, neighbouring turns are merged.
    Words are spread over turns in proportion to their durations; the count is then made exact
    in the longest turn (each filler word is one token). Raises ValueError when no transcript of
    that length exists (fewer than ~17 tokens).
    """
    target = num_output_tokens - 1
    words = _single_token_words(tokenizer)
    rng = np.random.default_rng(seed)
    turns = list(turns)
    counts = [1] * len(turns)
    while _num_tokens(tokenizer, turns, counts, words) > target:
        if len(turns) == 1:
            raise ValueError(f"no transcript of {target} tokens exists for these turns")
        turns = _merge_shortest(turns)
        counts = [1] * len(turns)
    spare = target - _num_tokens(tokenizer, turns, counts, words)
    durations = np.array([t.end_s - t.start_s for t in turns])
    share = spare * durations / durations.sum()
    extra = np.floor(share).astype(int)
    for i in np.argsort(share - extra)[::-1][: spare - int(extra.sum())]:
        extra[i] += 1
    counts = [c + int(e) for c, e in zip(counts, extra, strict=True)]
    longest = int(np.argmax(durations))
    for _ in range(8):
        diff = target - _num_tokens(tokenizer, turns, counts, words)
        if diff == 0:
            break
        counts[longest] = max(1, counts[longest] + diff)
    text = _render(turns, counts, words, rng)
    ids = tuple(tokenizer.encode(text, add_special_tokens=False).ids)
    if len(ids) != target:
        raise ValueError(f"transcript has {len(ids)} tokens, wanted {target}")
    return ForcedTranscript(text, ids, tuple(turns))


def _single_token_words(tokenizer: Tokenizer) -> tuple[str, ...]:
    words = tuple(w for w in WORDS if len(tokenizer.encode(w, add_special_tokens=False).ids) == 1)
    assert words, "no filler word is a single token"
    return words


def _render(
    turns: Sequence[Turn], counts: Sequence[int], words: Sequence[str], rng: np.random.Generator
) -> str:
    parts = []
    for turn, count in zip(turns, counts, strict=True):
        body = "".join(words[int(i)] for i in rng.integers(0, len(words), size=count))
        parts.append(f"[{turn.start_s:.2f}][S{turn.speaker + 1:02d}]{body}[{turn.end_s:.2f}]")
    return "".join(parts)


def _num_tokens(
    tokenizer: Tokenizer, turns: Sequence[Turn], counts: Sequence[int], words: Sequence[str]
) -> int:
    # The first word stands in for all: every filler word is one token after a space or word.
    text = _render(turns, counts, words[:1], np.random.default_rng(0))
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def _merge_shortest(turns: list[Turn]) -> list[Turn]:
    i = min(range(len(turns) - 1), key=lambda k: turns[k + 1].end_s - turns[k].start_s)
    merged = Turn(turns[i].speaker, turns[i].start_s, turns[i + 1].end_s)
    return [*turns[:i], merged, *turns[i + 2 :]]


def make_forced(
    tokenizer: Tokenizer, workload: Workload, seed: int = 0
) -> tuple[np.ndarray, ForcedTranscript]:
    """A meeting of `workload` (audio, forced transcript sharing the same turns)."""
    turns = plan_turns(workload.audio_s, seed)
    transcript = forced_transcript(tokenizer, turns, workload.num_output_tokens, seed)
    return synthetic_audio(workload.audio_s, seed, transcript.turns), transcript
