"""Speech ends in a live session's audio, from a frame-level voice activity detector (DESIGN.md
section 5.4: VAD never removes samples; it moves hops).

A live hop is due once a hop's worth of new audio has arrived (LIVE_HOP_S), so a turn that ends
just after a hop waits up to a whole hop before any decode hears its last words: at 1-s hops
that wait is about half of the partial latency at p50 (docs/benchmarks.md, session 19). An
`Endpointer` watches the audio as it is received and reports where speech stopped; the session
then decodes at once instead of waiting for the rest of the hop.

Frames are classified as they complete, in the classifier's own length: the classifier is
injected (`FrameClassifier`: it declares `frame_samples` and classifies a batch of frames, all
the frames a chunk completes in one call), so positions stay exact in samples whatever the
length. A speech end is the end of the last speech frame before VAD_END_SILENCE_S of
non-speech frames, when at least VAD_MIN_SPEECH_S of speech frames came since the previous
such silence (shorter pauses do not split them); both are rounded up to whole frames. Speech
shorter than VAD_MIN_SPEECH_S between end-length silences (clicks, a cough's onset) does not
count as heard either (`last_speech_end`), so it keeps no hop over silence running (a lone
word that short waits for the next hop that runs anyway, at most LIVE_SILENCE_HOP_S).

Two classifiers (`LiveVad`, `live_classifier`; `serve --live-vad`):
- WebRTC's VAD (`webrtc_classifier`, VAD_MODE, frames of VAD_FRAME_S = 30 ms, one of the
  three lengths webrtcvad takes; `PcmFrames` adapts its one-frame-of-PCM16 interface). The
  default.
- Silero VAD (`SileroClassifier`): faster-whisper's bundled model through its ONNX session,
  windows of SILERO_WINDOW_SAMPLES (32 ms), its LSTM state and context carried per session,
  speech from VAD_SILERO_THRESHOLD with Silero's hysteresis; needs the demo extra (else
  ConfigError).

Measured by `python -m loadtest.vad_study` on the shared data's three 30-s AMI excerpts
against their RTTM (100-ms chunks; README has the table). WebRTC mode 2 marks 68 / 54 / 89 %
of the frames as speech where the RTTM has 90 / 52 / 100 % (miss 17 %, false alarm 20 %, F1
0.88), finds 6 of the reference's 7 pause ends of >= 0.15 s within 0.25 s, runs 7 of the 14
silent 1-s hops and skips none of the 76 with speech (on the benchmark's synthetic meetings
it found 36 of 64 turn ends, 41 having pauses that long, and nothing inside a turn: session
20). Silero at 0.3: 61 / 42 / 85 % (miss 23 %, false alarm 1.5 %, F1 0.87), 6 of 7 ends, 1 of
14 silent hops run but 3 of 76 hops with speech skipped: quiet stretches the RTTM marks as
speech (-54 to -61 dB RMS where the talker's speech is ~-40 dB; dev01's last turn, 29.1-29.5
s) get probabilities near 0.01, so such speech waits up to LIVE_SILENCE_HOP_S for a hop. The
RTTM is turn-level (its turns hold their pauses), so the misses and the ends "inside" its speech
are partly pauses within a turn. Cost on the engine worker's CPU per second of a session's
audio (2-core CPU): WebRTC 0.15 ms, Silero 1.2 ms (a run of its network per chunk: its input
is a sequence of one stream's windows with one LSTM state, so sessions cannot share a run):
1.5 % and 12 % of a core at 100 sessions. Hence WebRTC by default.

Sans-I/O: no clock, no threads; positions are sample indices at 16 kHz from the session start.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

from livemeet.audio.constants import (
    SAMPLE_RATE,
    SILERO_CONTEXT_SAMPLES,
    SILERO_WINDOW_SAMPLES,
    VAD_END_SILENCE_S,
    VAD_FRAME_S,
    VAD_MIN_SPEECH_S,
    VAD_MODE,
    VAD_SILERO_HYSTERESIS,
    VAD_SILERO_THRESHOLD,
)
from livemeet.errors import ConfigError

Classifier = Callable[[bytes], bool]  # one frame of 16-bit little-endian PCM -> speech?

FRAME_SAMPLES = round(VAD_FRAME_S * SAMPLE_RATE)
PCM16_MAX = 32767
SILERO_HINT = "install the demo extra (pip install 'livemeet[demo]'), or use --live-vad webrtc"
SILERO_STATE_SHAPE = [1, 1, 128]  # the Silero network's LSTM h and c: [layers, batch, units]


class LiveVad(StrEnum):
    """Which voice activity detector a live session's Endpointer hears with (`serve
    --live-vad`). `WEBRTC`: webrtcvad at VAD_MODE, always installed. `SILERO`: Silero VAD,
    faster-whisper's bundled model (the demo extra)."""

    WEBRTC = "webrtc"
    SILERO = "silero"


class FrameClassifier(Protocol):
    """What an Endpointer hears with: frames of `frame_samples` samples at 16 kHz (the
    detector's own length), consecutive frames of one stream in order, classified as a batch.
    It may keep state from frame to frame (a recurrent network, WebRTC's noise estimate), so
    each stream needs its own."""

    frame_samples: int

    def classify(self, frames: np.ndarray) -> np.ndarray:
        """float32 [k, frame_samples] in [-1, 1] -> bool [k], speech or not."""
        ...


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
    """float [...] in [-1, 1] -> int16 [...], what a `Classifier`'s frames are cut from."""
    pcm: np.ndarray = (np.clip(samples, -1.0, 1.0) * PCM16_MAX).astype(np.int16)
    return pcm


class PcmFrames:
    """A FrameClassifier of VAD_FRAME_S frames from a `Classifier` of one 16-bit PCM frame
    at a time (webrtcvad's shape)."""

    frame_samples = FRAME_SAMPLES

    def __init__(self, classifier: Classifier) -> None:
        self.classifier = classifier

    def classify(self, frames: np.ndarray) -> np.ndarray:
        pcm = _pcm16(frames)
        return np.fromiter(
            (self.classifier(frame.tobytes()) for frame in pcm), dtype=bool, count=len(pcm)
        )


def speech_frames(samples: np.ndarray, classifier: Classifier) -> np.ndarray:
    """Which whole frames of VAD_FRAME_S in `samples` (float [n] in [-1, 1], 16 kHz) the
    classifier calls speech: bool [n // FRAME_SAMPLES] (a partial last frame is not
    classified)."""
    num = samples.size // FRAME_SAMPLES
    return PcmFrames(classifier).classify(samples[: num * FRAME_SAMPLES].reshape(num, -1))


def silero_model() -> Any:
    """faster-whisper's bundled Silero VAD (`faster_whisper.vad.get_vad_model()`: one ONNX
    session per process, loaded once, one CPU thread). Raises ConfigError naming the extra to
    install when faster-whisper or onnxruntime is missing, or when its model is not the one
    SileroClassifier drives (inputs `input` [n, 576] and the LSTM state `h` and `c`)."""
    try:
        import onnxruntime  # noqa: F401  (faster-whisper imports it only when the model loads)
        from faster_whisper.vad import get_vad_model
    except ImportError as exc:
        raise ConfigError(
            f"the Silero VAD needs faster-whisper and onnxruntime ({exc}); {SILERO_HINT}"
        ) from exc
    model = get_vad_model()
    inputs = {i.name: i.shape for i in model.session.get_inputs()}
    width = SILERO_CONTEXT_SAMPLES + SILERO_WINDOW_SAMPLES
    if set(inputs) != {"input", "h", "c"} or not (
        inputs["input"][-1] == width and inputs["h"] == inputs["c"] == SILERO_STATE_SHAPE
    ):
        raise ConfigError(
            f"faster-whisper's Silero model takes {inputs}, not the windows and LSTM state of "
            f"the one faster-whisper 1.2 bundles (silero_vad_v6); {SILERO_HINT}"
        )
    return model


class SileroClassifier:
    """Silero VAD over windows of SILERO_WINDOW_SAMPLES (32 ms), streaming: each window is
    read after the last SILERO_CONTEXT_SAMPLES of the one before and continues the network's
    LSTM state, as faster-whisper's `SileroVADModel.__call__` runs a whole clip, so a stream
    fed in any chunks gets the probabilities of the whole clip. A window is speech from one
    whose probability reaches `threshold` until one falls below `threshold - hysteresis`
    (Silero's own rule; faster-whisper's `VadOptions`). The state (LSTM, context, in speech)
    is this object's: one per session, so no session's audio reaches another's; the ONNX
    session they share holds none. Raises ConfigError as `silero_model` does, ValueError for
    a threshold outside (0, 1)."""

    frame_samples = SILERO_WINDOW_SAMPLES

    def __init__(
        self,
        threshold: float = VAD_SILERO_THRESHOLD,
        hysteresis: float = VAD_SILERO_HYSTERESIS,
    ) -> None:
        if not 0.0 < threshold < 1.0 or hysteresis < 0.0:
            raise ValueError(
                f"need 0 < threshold < 1 and hysteresis >= 0, not {threshold}, {hysteresis}"
            )
        self._model = silero_model()
        self.threshold = threshold
        self.end_threshold = max(threshold - hysteresis, 0.01)  # as VadOptions.neg_threshold
        self._h = np.zeros(SILERO_STATE_SHAPE, np.float32)
        self._c = np.zeros(SILERO_STATE_SHAPE, np.float32)
        self._context = np.zeros(SILERO_CONTEXT_SAMPLES, np.float32)  # the last window's tail
        self._speech = False

    def probabilities(self, frames: np.ndarray) -> np.ndarray:
        """Speech probabilities of the next windows: float32 [k, SILERO_WINDOW_SAMPLES] in
        [-1, 1] -> float32 [k]. One ONNX run for all k (the network reads them in order)."""
        if not len(frames):
            return np.zeros(0, np.float32)
        frames = np.asarray(frames, np.float32)
        before = np.vstack((self._context[None], frames[:-1, -SILERO_CONTEXT_SAMPLES:]))
        batch = np.concatenate((before, frames), axis=1)  # [k, 576]
        probs, self._h, self._c = self._model.session.run(
            None, {"input": batch, "h": self._h, "c": self._c}
        )
        self._context = frames[-1, -SILERO_CONTEXT_SAMPLES:].copy()
        out: np.ndarray = np.asarray(probs, np.float32).reshape(-1)
        return out

    def classify(self, frames: np.ndarray) -> np.ndarray:
        probs = self.probabilities(frames)
        speech = np.empty(probs.size, dtype=bool)
        for k, p in enumerate(probs):
            if p >= self.threshold:
                self._speech = True
            elif p < self.end_threshold:
                self._speech = False
            speech[k] = self._speech
        return speech


def live_classifier(kind: LiveVad) -> FrameClassifier:
    """A fresh classifier for one live session (state is per stream). Raises ConfigError for
    SILERO without faster-whisper and onnxruntime."""
    if kind is LiveVad.SILERO:
        return SileroClassifier()
    return PcmFrames(webrtc_classifier())


class Endpointer:
    """Finds speech ends in audio fed in order (module docstring), in frames of the
    classifier's own length. `end_silence_s` and `min_speech_s` in seconds, rounded up to
    whole frames."""

    def __init__(
        self,
        classifier: FrameClassifier,
        *,
        end_silence_s: float = VAD_END_SILENCE_S,
        min_speech_s: float = VAD_MIN_SPEECH_S,
    ) -> None:
        if end_silence_s <= 0 or min_speech_s <= 0:
            raise ValueError("end_silence_s and min_speech_s must be > 0")
        self.classifier = classifier
        self.frame_samples = classifier.frame_samples
        self.end_frames = -(-round(end_silence_s * SAMPLE_RATE) // self.frame_samples)
        self.min_speech_frames = -(-round(min_speech_s * SAMPLE_RATE) // self.frame_samples)
        self._pending = np.zeros(0, dtype=np.float32)  # samples of the frame not yet complete
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
        return self.end_frames * self.frame_samples

    @property
    def num_samples(self) -> int:
        """Samples fed so far."""
        return self._frames * self.frame_samples + self._pending.size

    def feed(self, samples: np.ndarray) -> None:
        """Classify the frames `samples` (float [n] in [-1, 1], 16 kHz) complete, all in one
        call of the classifier."""
        audio = np.asarray(samples, dtype=np.float32)
        if self._pending.size:
            audio = np.concatenate((self._pending, audio))
        num = audio.size // self.frame_samples
        whole = num * self.frame_samples
        if num:
            for speech in self.classifier.classify(audio[:whole].reshape(num, -1)):
                self._frame(bool(speech))
        self._pending = audio[whole:].copy()

    def _frame(self, speech: bool) -> None:
        self._frames += 1
        if speech:
            self._speech_frames += 1
            self._silent_frames = 0
            if self._speech_frames >= self.min_speech_frames:
                self.last_speech_end = self._frames * self.frame_samples
            return
        self._silent_frames += 1
        if self._silent_frames == self.end_frames:
            if self._speech_frames >= self.min_speech_frames:
                self.last_end = self.last_speech_end
                self.num_ends += 1
            self._speech_frames = 0  # blips apart by a silence never add up to speech
