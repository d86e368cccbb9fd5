"""Speech ends in a live session's audio, from a frame-level voice activity detector (DESIGN.md
section 5.4: VAD never removes samples; it moves hops).

A live hop is due once a hop's worth of new audio has arrived (LIVE_HOP_S), so a turn that ends
just after a hop waits up to a whole hop before any decode hears its last words: at 1-s hops
that wait is about half of the partial latency at p50 (docs/benchmarks.md, session 19). An
`Endpointer` watches the audio as it is received and reports where speech stopped; the session
then decodes at once instead of waiting for the rest of the hop.

Frames of VAD_FRAME_S (30 ms, one of the three lengths webrtcvad takes) are classified as they
complete. A speech end is the end of the last speech frame before VAD_END_SILENCE_S of
non-speech frames, when at least VAD_MIN_SPEECH_S of speech frames came since the previous
such silence (shorter pauses do not split them). The classifier is injected (`Classifier`:
16-bit PCM frame bytes -> speech or not); `webrtc_classifier` builds the default, WebRTC's VAD
at VAD_MODE. Measured on this repository's data (session 20): on the AMI excerpts against
their RTTM, mode 2 marked 69 / 54 / 89 % of the frames as speech where the reference has
90 / 52 / 100 %; on the benchmark's synthetic meetings, 150 ms of silence found 36 of 64 turn
ends (41 have pauses that long) and nothing inside a turn. Speech shorter than
VAD_MIN_SPEECH_S between end-length silences (clicks, a cough's onset) does not count as heard
either (`last_speech_end`), so it keeps no hop over silence running (a lone word that short
waits for the next hop that runs anyway, at most LIVE_SILENCE_HOP_S); on the AMI excerpts 1-s
intervals without heard speech went from 1 / 6 / 0 to 2 / 6 / 0 of 30 (session 21: they are
mostly speech). It costs the engine worker ~0.22 ms
of CPU per second of a session's audio (2-core CPU, 100-ms chunks): ~2 % of it at 100 sessions.

Sans-I/O: no clock, no threads; positions are sample indices at 16 kHz from the session start.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from livemeet.audio.constants import (
    SAMPLE_RATE,
    VAD_END_SILENCE_S,
    VAD_FRAME_S,
    VAD_MIN_SPEECH_S,
    VAD_MODE,
)

Classifier = Callable[[bytes], bool]  # one frame of 16-bit little-endian PCM -> speech?

FRAME_SAMPLES = round(VAD_FRAME_S * SAMPLE_RATE)
PCM16_MAX = 32767


def webrtc_classifier(mode: int = VAD_MODE) -> Classifier:
    """WebRTC's VAD (the webrtcvad package) at aggressiveness `mode` (0-3) over 16 kHz frames
    of VAD_FRAME_S. Raises ValueError for another mode."""
    import webrtcvad

    if mode not in (0, 1, 2, 3):
        raise ValueError(f"VAD mode must be 0-3, not {mode}")
    vad = webrtcvad.Vad(mode)

    def is_speech(frame: bytes) -> bool:
        return bool(vad.is_speech(frame, SAMPLE_RATE))

    return is_speech


def _pcm16(samples: np.ndarray) -> np.ndarray:
    """float [n] in [-1, 1] -> int16 [n], what the classifier's frames are cut from."""
    pcm: np.ndarray = (np.clip(samples, -1.0, 1.0) * PCM16_MAX).astype(np.int16)
    return pcm


def speech_frames(samples: np.ndarray, classifier: Classifier) -> np.ndarray:
    """Which whole frames of VAD_FRAME_S in `samples` (float [n] in [-1, 1], 16 kHz) the
    classifier calls speech: bool [n // FRAME_SAMPLES] (a partial last frame is not
    classified)."""
    pcm = _pcm16(samples)
    num = pcm.size // FRAME_SAMPLES
    return np.fromiter(
        (
            classifier(pcm[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES].tobytes())
            for k in range(num)
        ),
        dtype=bool,
        count=num,
    )


class Endpointer:
    """Finds speech ends in audio fed in order (module docstring). `end_silence_s` and
    `min_speech_s` in seconds, rounded up to whole frames."""

    def __init__(
        self,
        classifier: Classifier,
        *,
        end_silence_s: float = VAD_END_SILENCE_S,
        min_speech_s: float = VAD_MIN_SPEECH_S,
    ) -> None:
        if end_silence_s <= 0 or min_speech_s <= 0:
            raise ValueError("end_silence_s and min_speech_s must be > 0")
        self.classifier = classifier
        self.end_frames = -(-round(end_silence_s * SAMPLE_RATE) // FRAME_SAMPLES)
        self.min_speech_frames = -(-round(min_speech_s * SAMPLE_RATE) // FRAME_SAMPLES)
        self._pending = np.zeros(0, dtype=np.int16)  # samples of the frame not yet complete
        self._frames = 0  # frames classified
        self._speech_frames = 0  # speech frames since the last end-length silence
        self._silent_frames = 0  # non-speech frames since the last speech frame
        # sample index after the last speech frame of speech that counts (0: none yet): from
        # the frame that brings the run to min_speech_frames on, as for ends, so a noisy
        # room's blips do not keep hops over silence from being skipped (LiveSession)
        self.last_speech_end = 0
        self.last_end: int | None = None  # sample index of the latest speech end, if any
        self.num_ends = 0

    @property
    def end_silence_samples(self) -> int:
        """Samples of silence that make a speech end (whole frames)."""
        return self.end_frames * FRAME_SAMPLES

    @property
    def num_samples(self) -> int:
        """Samples fed so far."""
        return self._frames * FRAME_SAMPLES + self._pending.size

    def feed(self, samples: np.ndarray) -> None:
        """Classify the frames `samples` (float [n] in [-1, 1], 16 kHz) complete."""
        pcm = _pcm16(samples)
        if self._pending.size:
            pcm = np.concatenate((self._pending, pcm))
        whole = pcm.size // FRAME_SAMPLES * FRAME_SAMPLES
        for start in range(0, whole, FRAME_SAMPLES):
            self._frame(self.classifier(pcm[start : start + FRAME_SAMPLES].tobytes()))
        self._pending = pcm[whole:].copy()

    def _frame(self, speech: bool) -> None:
        self._frames += 1
        if speech:
            self._speech_frames += 1
            self._silent_frames = 0
            if self._speech_frames >= self.min_speech_frames:
                self.last_speech_end = self._frames * FRAME_SAMPLES
            return
        self._silent_frames += 1
        if self._silent_frames == self.end_frames:
            if self._speech_frames >= self.min_speech_frames:
                self.last_end = self.last_speech_end
                self.num_ends += 1
            self._speech_frames = 0  # blips apart by a silence never add up to speech
